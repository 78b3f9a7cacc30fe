package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// humanBytes turns the raw integers of a runtime message into sizes and
// leaves figures that are already sizes alone — fractional ones included
// ("used 1.5 GiB" stays as it is, never "used 1 B.5 GiB").
func TestHumanBytes(t *testing.T) {
	cases := map[string]string{
		"budget exceeded: used 3145728 + reserved 0 + requested 2097152 > budget 4194304 (short by 1048576 bytes)": "budget exceeded: used 3 MiB (3145728) + reserved 0 B + requested 2 MiB (2097152) > budget 4 MiB (4194304) (short by 1 MiB (1048576))",
		"cuda:0 used 1.5 GiB (1610612736) reserved 0 B peak 1.5 GiB (1610612736) (budget 64 GiB (68719476736))":    "cuda:0 used 1.5 GiB (1610612736) reserved 0 B peak 1.5 GiB (1610612736) (budget 64 GiB (68719476736))",
		"cuda:0 used 27.5 GiB (29527900160) reserved 40 GiB (42949672960) (budget 80 GiB (85899345920))":           "cuda:0 used 27.5 GiB (29527900160) reserved 40 GiB (42949672960) (budget 80 GiB (85899345920))",
		"no figures here":        "no figures here",
		"budget 512 needs 12.25": "budget 512 B needs 12.25",
	}
	for in, want := range cases {
		assert.Equal(t, want, humanBytes(in), in)
	}
}
