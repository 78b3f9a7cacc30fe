package staging

// Test-only switches (this file is compiled only into the package's tests).

// SkipFreezeWait makes the pipeline drop the device→host copy's wait on the
// step's freeze event: the ordering proof shows the bytes then differ.
func SkipFreezeWait(c *Config) { c.skipFreezeWait = true }

// OnClaim observes every copy-stage claim, in order.
func OnClaim(c *Config, f func(TaskID)) { c.onClaim = f }
