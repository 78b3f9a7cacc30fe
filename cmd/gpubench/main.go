//go:build cuda

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/cu"
)

func main() {
	device := flag.Int("device", 0, "CUDA device ordinal")
	bytes := flag.Int64("bytes", 256<<20, "bytes per copy")
	iters := flag.Int("iters", 20, "copies per measurement")
	flag.Parse()
	if *bytes <= 0 || *iters <= 0 || *device < 0 {
		fmt.Fprintln(os.Stderr, "gpubench: -bytes and -iters must be positive, -device not negative")
		os.Exit(2)
	}
	if err := run(*device, *bytes, *iters); err != nil {
		fmt.Fprintln(os.Stderr, "gpubench:", err)
		os.Exit(1)
	}
}

type row struct {
	path, dst       string
	each, pipelined time.Duration
}

func run(ordinal int, n int64, iters int) error {
	dev := fmt.Sprintf("cuda:%d", ordinal)
	b, err := cu.New(cu.Config{Locations: []string{dev, "pinned-host", "pageable-host"}})
	if err != nil {
		return err
	}
	defer b.Close()
	name, err := b.DeviceName(dev)
	if err != nil {
		return err
	}
	fmt.Printf("device %s: %s; %d copies of %d bytes (%.1f MiB) device→host\n\n", dev, name, iters, n, float64(n)/(1<<20))

	var rows []row
	each, pipe, err := plainDtoH(ordinal, n, iters)
	if err != nil {
		return err
	}
	rows = append(rows, row{"plain cuMemcpyDtoHAsync (C)", "pinned-host", each, pipe})
	for _, dst := range []string{"pinned-host", "pageable-host"} {
		each, pipe, err := backendDtoH(b, dev, dst, n, iters)
		if err != nil {
			return err
		}
		rows = append(rows, row{"cu backend CopyAsync", dst, each, pipe})
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "path\tdestination\tper copy (GB/s)\tpipelined (GB/s)\tper-copy time")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%.2f\t%v\n", r.path, r.dst, gbps(n, iters, r.each), gbps(n, iters, r.pipelined), r.each/time.Duration(iters))
	}
	return w.Flush()
}

func gbps(n int64, iters int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) * float64(iters) / d.Seconds() / 1e9
}

// backendDtoH measures the backend's copy path from dev into dst.
func backendDtoH(b *cu.Backend, dev, dst string, n int64, iters int) (each, pipelined time.Duration, err error) {
	ctx := context.Background()
	src, err := b.Allocate(ctx, dev, n)
	if err != nil {
		return 0, 0, err
	}
	defer b.Free(src)
	out, err := b.Allocate(ctx, dst, n)
	if err != nil {
		return 0, 0, err
	}
	defer b.Free(out)
	if err := b.Load(ctx, src, "", func(_ context.Context, p []byte) error {
		for i := range p {
			p[i] = 0x5a
		}
		return nil
	}); err != nil {
		return 0, 0, err
	}
	s, err := b.NewStream(dev)
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	wait := func() error {
		ev, err := s.Record()
		if err != nil {
			return err
		}
		return ev.Wait(ctx)
	}
	one := func() error {
		if err := s.CopyAsync(out, src); err != nil {
			return err
		}
		return wait()
	}
	if err := one(); err != nil { // warm-up
		return 0, 0, err
	}
	t0 := time.Now()
	for range iters {
		if err := one(); err != nil {
			return 0, 0, err
		}
	}
	each = time.Since(t0)
	t0 = time.Now()
	for range iters {
		if err := s.CopyAsync(out, src); err != nil {
			return 0, 0, err
		}
	}
	if err := wait(); err != nil {
		return 0, 0, err
	}
	pipelined = time.Since(t0)
	if err := check(b, out); err != nil {
		return 0, 0, err
	}
	return each, pipelined, nil
}

func check(b cuda.Backend, buf cuda.Buffer) error {
	got, err := b.Read(context.Background(), buf)
	if err != nil {
		return err
	}
	for i, c := range got {
		if c != 0x5a {
			return fmt.Errorf("copied bytes differ at %d of %s", i, buf.Location())
		}
	}
	return nil
}
