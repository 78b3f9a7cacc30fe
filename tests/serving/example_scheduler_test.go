package serving

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Model is a model's weights as a scheduler keeps them on a GPU.
type Model struct {
	Name string
	GPU  string
}

// Scheduler serves requests for models on either of two GPUs: a request
// takes the model where it is resident, or loads it on the GPU with the
// most room — making room by unloading idle models there — or waits in a
// bounded queue until a GPU has room. Each request says how long its
// model stays once idle. The scheduler does no byte arithmetic of its own:
// the runtime's cache picks the GPU and the victims.
type Scheduler struct {
	sys    *system.System
	models *cache.Cache
}

// NewScheduler starts a scheduler over two simulated GPUs of gpuBytes
// each (the soft backend), with at most maxWaiting requests waiting.
func NewScheduler(ctx context.Context, gpuBytes int64, maxWaiting int) (*Scheduler, error) {
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", gpuBytes), system.Limit("cuda:1", gpuBytes)}
	backend, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		return nil, err
	}
	// The runtime owns the backend: its Close closes the backend last.
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: backend, CloseBackend: true, MaxWaiters: maxWaiting})
	if err != nil {
		return nil, err
	}
	models, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Locations: []string{"cuda:1"}, Name: "models"})
	if err != nil {
		return nil, err
	}
	return &Scheduler{sys: sys, models: models}, nil
}

// Request is one inference request.
type Request struct {
	Model     string
	Bytes     int64
	KeepAlive time.Duration          // how long the model stays once idle (0: unload when done)
	Queued    func(system.WaitState) // told when the request waits for room (nil: not told)
}

// Acquire returns a lease on the request's model, resident on a GPU;
// release it when the request is done.
func (s *Scheduler) Acquire(ctx context.Context, r Request) (cache.Lease[*Model], error) {
	wait := []system.WaitOption{system.WaitForRoom()}
	if r.Queued != nil {
		wait = append(wait, system.WaitNotify(r.Queued))
	}
	return cache.LoadOn(ctx, s.models, r.Model, [][]string{{"cuda:0", "cuda:1"}}, r.Bytes, nil,
		func(ctx context.Context, gpu string) (*Model, error) { return &Model{Name: r.Model, GPU: gpu}, nil },
		cache.WithTie(cache.TieMostFree), cache.WithKeepAlive(r.KeepAlive), cache.Wait(wait...))
}

// Resident lists the models loaded now and their GPUs.
func (s *Scheduler) Resident() []string {
	var out []string
	for _, e := range s.models.Entries() {
		out = append(out, e.Key+"@"+e.Parts[0].Location)
	}
	return out
}

// Close unloads every model and stops the runtime: the runtime's Close
// closes the caches opened on it first and its backend last.
func (s *Scheduler) Close(ctx context.Context) error { return s.sys.Close(ctx) }

// Three models of 60 bytes on two GPUs of 100: the third request waits
// until the first, which asked to unload when done, ends; the second
// stays loaded for its keep-alive.
func ExampleScheduler() {
	ctx := context.Background()
	s, err := NewScheduler(ctx, 100, 4)
	if err != nil {
		log.Fatal(err)
	}
	llama, err := s.Acquire(ctx, Request{Model: "llama", Bytes: 60, KeepAlive: 0})
	if err != nil {
		log.Fatal(err)
	}
	mistral, err := s.Acquire(ctx, Request{Model: "mistral", Bytes: 60, KeepAlive: 5 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("serving:", llama.Value().Name, "on", llama.Value().GPU, "and", mistral.Value().Name, "on", mistral.Value().GPU)

	queued := make(chan system.WaitState, 1)
	qwen := make(chan cache.Lease[*Model])
	go func() {
		l, err := s.Acquire(ctx, Request{Model: "qwen", Bytes: 60, KeepAlive: time.Minute,
			Queued: func(st system.WaitState) {
				select {
				case queued <- st:
				default:
				}
			}})
		if err != nil {
			log.Fatal(err)
		}
		qwen <- l
	}()
	st := <-queued
	fmt.Printf("qwen waits: position %d, %d bytes short\n", st.Position, st.Shortfall)
	if err := llama.Release(); err != nil { // llama unloads now: room on cuda:0
		log.Fatal(err)
	}
	q := <-qwen
	fmt.Println("serving:", q.Value().Name, "on", q.Value().GPU)
	if err := mistral.Release(); err != nil { // mistral stays 5 minutes once idle
		log.Fatal(err)
	}
	fmt.Println("resident:", s.Resident())
	if err := q.Release(); err != nil {
		log.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// serving: llama on cuda:0 and mistral on cuda:1
	// qwen waits: position 0, 20 bytes short
	// serving: qwen on cuda:0
	// resident: [mistral@cuda:1 qwen@cuda:0]
}
