package soft

// NewSparse is New with the size from which buffers keep their bytes in
// a region, and the region's chunk size (a multiple of the OS page size),
// set by the test, so that small buffers exercise regions.
func NewSparse(cfg Config, sparseMin, chunk int64) (*Backend, error) {
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	b.sparseMin, b.chunk = sparseMin, chunk
	return b, nil
}
