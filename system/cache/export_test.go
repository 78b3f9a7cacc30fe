package cache

// SetDropHook makes f run as the controller's drop of one of c's entries
// starts, before the cache looks at the entry: what f does happens
// between the decision and the drop.
func SetDropHook(c *Cache, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropHook = f
}

// Drains returns how many times the runtime drained c's offers.
func Drains(c *Cache) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drains
}
