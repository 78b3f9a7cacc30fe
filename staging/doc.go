// Package staging is the room for the device→host write pipeline of seed
// 004 (staging slot pool, GPU-byte budget, write tasks, copy queues and
// the committer; see DESIGN.md). It is not built yet and exports nothing:
// no issue has asked for it so far. Nothing else in the module depends on
// it.
package staging
