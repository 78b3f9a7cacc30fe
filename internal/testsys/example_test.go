package testsys_test

import (
	"fmt"

	"github.com/residency-go/residency/internal/testsys"
)

var sink []byte

// Allocated measures what a piece of code allocates on the Go heap.
func ExampleAllocated() {
	n := testsys.Allocated(func() { sink = make([]byte, 1<<20) })
	fmt.Println(n >= 1<<20)
	// Output: true
}
