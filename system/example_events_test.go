package system_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// Structured events: a refused admission as the operator's log shows it,
// at the level the application chose (here warn, on a logger at warn: the
// runtime's info lines stay out).
func ExampleOptions_eventLevel() {
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<30)}
	be, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
	logger := zerolog.New(os.Stdout).Level(zerolog.WarnLevel)
	sys, err := system.Start(ctx, system.Options{ManagerID: "example", Locations: locs, Backend: be,
		Logger: &logger, EventLevel: zerolog.WarnLevel})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = sys.Close(ctx) }()
	fmt.Println(sys.Reserve(ctx, "cuda:0", "kv", 2<<30) != nil)
	// Output:
	// {"level":"warn","event":"admission_refused","op":"reserve","class":"ResidencyBudgetError","state_version":0,"reason":"budget","location":"cuda:0","bytes":2147483648,"budget_bytes":1073741824,"used_bytes":0,"reserved_bytes":0,"error":"residency budget exceeded at cuda:0: used 0 + reserved 0 + requested 2147483648 > budget 1073741824 (short by 1073741824 bytes)","message":"admission refused"}
	// true
}

// A staging pipeline's failure reaches the runtime's event log; package
// staging calls this itself on a *System.
func ExampleSystem_ReportStagingFailure() {
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host")}
	be, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
	logger := zerolog.New(os.Stdout).Level(zerolog.WarnLevel)
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: be, Logger: &logger, EventLevel: zerolog.WarnLevel})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = sys.Close(ctx) }()
	sys.ReportStagingFailure("checkpoint", "cuda:0", 3, errors.New("device copy failed"))
	// Output:
	// {"level":"warn","event":"staging_failed","pipeline":"checkpoint","location":"cuda:0","task":3,"error":"device copy failed","message":"staging pipeline failed"}
}
