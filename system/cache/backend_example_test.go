package cache_test

import (
	"log"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// simulated returns opts with the soft backend for its locations: the
// examples run without a GPU, so they ask for simulated devices by name
// (system.SoftBackend). Close the backend after the runtime:
// sys.Backend().Close().
func simulated(opts system.Options) system.Options {
	b, err := system.SoftBackend(opts.Locations, soft.Config{})
	if err != nil {
		log.Fatal(err)
	}
	opts.Backend = b
	return opts
}
