package nodeproc_test

import (
	"context"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/internal/nodeproc"
)

// A server reads one command per line and answers each with one JSON
// reply. `demo node` serves its cluster node this way; the lines here are
// refused before they reach a node, so this server needs none.
func ExampleServer() {
	s := nodeproc.NewServer(nil, os.Stdout, zerolog.Nop())
	defer s.Stop()
	s.Serve(context.Background(), strings.NewReader(
		`{"id":1,"op":"copy","name":"w","bytes":"1MiB","from":"node-a"}`+"\n"+
			`{"id":2,"op":"members","color":"red"}`+"\n"))
	// Output:
	// {"id":1,"op":"copy","ok":false,"error":"malformed command: op \"copy\": needs field \"at\"","error_type":"InvalidInputError","elapsed_ms":0}
	// {"id":2,"op":"members","ok":false,"error":"malformed command: op \"members\": unknown field \"color\"","error_type":"InvalidInputError","elapsed_ms":0}
}
