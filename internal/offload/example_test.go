package offload_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/residency-go/residency/internal/offload"
)

// Two requests of a serving trace, replayed a thousand times faster than
// they arrived: each one's KV (context and generated tokens, in blocks of
// 16) is saved through the staging pipeline, and no budget is exceeded.
func ExampleRun() {
	trace := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,396,109\n"
	rows, err := offload.ReadTrace(strings.NewReader(trace), 0)
	if err != nil {
		panic(err)
	}
	rep, err := offload.Run(context.Background(), offload.Config{Trace: "two requests", BytesPerToken: 64, Speed: 1000}, rows)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d requests, %d tokens, %d KV bytes standing for %d\n", rep.Requests, rep.Tokens, rep.KVBytes, rep.KVBytes*rep.Scale)
	fmt.Printf("tasks failed %d, budget violations %d\n", rep.TasksFailed, rep.BudgetViolations)
	// Output:
	// 2 requests, 923 tokens, 60416 KV bytes standing for 494927872
	// tasks failed 0, budget violations 0
}
