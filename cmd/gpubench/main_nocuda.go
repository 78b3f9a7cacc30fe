//go:build !cuda

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "gpubench drives a real GPU and is built only with -tags cuda (see make gpu-check)")
	os.Exit(2)
}
