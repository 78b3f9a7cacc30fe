package system_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
)

// Both GPUs fit the request with no eviction: by default the first listed
// wins; with TieMostFree the GPU with more free bytes does.
func ExampleTieBreak() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	if _, err := sys.Register(ctx, system.Value{Name: "cache", Bytes: 40 << 10, At: "cuda:0"}); err != nil {
		log.Fatal(err)
	}
	h, _ := sys.Register(ctx, system.Value{Name: "weights", Bytes: 16 << 10, At: "pinned-host"})
	for _, tie := range []system.TieBreak{system.TieFirstListed, system.TieMostFree} {
		d, err := sys.Decide(ctx, system.Request{
			Name:         "step",
			Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0", "cuda:1"}}}},
			TieBreak:     tie,
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(tie, "→", d.Plan.Enter[0].Location)
	}
	// Output:
	// first-listed → cuda:0
	// most-free → cuda:1
}
