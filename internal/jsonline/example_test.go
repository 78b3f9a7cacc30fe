package jsonline_test

import (
	"fmt"

	"github.com/residency-go/residency/internal/jsonline"
)

// Parse reads one line; Fields reads its typed fields and keeps the first
// problem.
func ExampleParse() {
	v, err := jsonline.Parse([]byte(`{"op":"reserve","bytes":"1.5KiB","tiers":["cuda:0",["cuda:1","cuda:2"]]}`))
	if err != nil {
		panic(err)
	}
	f := &jsonline.Fields{Obj: &v}
	fmt.Println(f.Str("op"), f.Bytes("bytes"), f.Tiers("tiers"))
	f.RejectUnknown([]string{"op", "bytes"})
	fmt.Println(f.Err)

	_, err = jsonline.Parse([]byte(`{"a":1,"a":2}`))
	fmt.Println(err)
	// Output:
	// reserve 1536 [[cuda:0] [cuda:1 cuda:2]]
	// unknown field "tiers"
	// column 8: duplicate key "a" in one object (each key may appear once)
}

// ParseBytes and FormatBytes read and write byte sizes.
func ExampleParseBytes() {
	n, err := jsonline.ParseBytes("40GiB")
	fmt.Println(n, err, jsonline.FormatBytes(n), jsonline.BytesText(n))
	v, p := jsonline.ParseInt("2.50e1")
	fmt.Println(v, p == jsonline.NumberOK)
	// Output:
	// 42949672960 <nil> 40 GiB 40 GiB (42949672960)
	// 25 true
}
