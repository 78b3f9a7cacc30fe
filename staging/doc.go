// Package staging is the device→host write pipeline of a KV-cache offload:
// rows computed on a device are copied to host memory and written into a
// CPU block pool, asynchronously, under strict byte budgets.
package staging
