//go:build !linux

package soft

// mapMemory returns n zero bytes of Go memory (the portable fallback: no
// lazily backed mapping); ok is false if the Go runtime refuses the length.
func mapMemory(n int64) (mem []byte, mapped, ok bool) {
	mem, ok = goMemory(n)
	return mem, false, ok
}

// unmapMemory is never called without mappings.
func unmapMemory([]byte) {}

// dropPages reports false: the caller clears the bytes itself.
func dropPages([]byte) bool { return false }

// touchedChunks calls visit(i) for every chunk i of mem that skip(i) does
// not exclude: without a way to ask which pages were touched, each chunk
// is examined.
func touchedChunks(mem []byte, chunk int64, skip func(i int) bool, visit func(i int)) {
	visitAll(int((int64(len(mem))+chunk-1)/chunk), skip, visit)
}
