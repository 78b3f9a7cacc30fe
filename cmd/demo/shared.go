package main

import (
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/replay"
)

// What the other commands share with the replay format: byte sizes as
// scripts write them (internal/jsonline), the deterministic bytes of a
// value, the order of locations, the byte order mark a script may start
// with.

func parseByteString(s string) (int64, error) { return jsonline.ParseBytes(s) }

func formatBytes(n int64) string { return jsonline.FormatBytes(n) }

func bytesText(n int64) string { return jsonline.BytesText(n) }

func fill(name string, off int64, dst []byte) { replay.Fill(name, off, dst) }

func deterministicLoader(name string) cuda.Loader { return replay.Loader(name) }

func sortLocations(names []string) { replay.SortLocations(names) }

// Every command of the demo runs on the soft backend (package cuda/soft):
// simulated devices, asked for by name here, because the runtime has no
// default backend. Each command says so in what it prints. The backend is
// behind the fault injector of package cuda/faulty, so that the scenario
// can make device operations fail.

// newSoftBackend opens the soft backend for locs (system.SoftBackend),
// behind the fault injector. The caller closes it after the runtime.
func newSoftBackend(locs []system.LocationConfig) (*faulty.Backend, error) {
	b, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		return nil, err
	}
	return faulty.Wrap(b, soft.ErrorPrefix), nil
}
