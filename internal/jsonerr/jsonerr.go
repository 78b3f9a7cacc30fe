// Package jsonerr puts the errors of encoding/json in the words of the
// JSON a user wrote: the field's path and the kinds of value wanted and
// found, never the names of the Go types the JSON was decoded into.
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Words puts an error of encoding/json's Unmarshal in JSON's words:
// a value of the wrong kind becomes `field "a.b": want an integer, got a
// string`, never Go's names of the types it was decoded into. A syntax
// error keeps its text and gains its byte offset; anything else is
// returned as it is. The result unwraps to err.
func Words(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		got := te.Value
		switch {
		case got == "array" || got == "object":
			got = "an " + got
		case got == "bool":
			got = "a boolean"
		case got == "string" || got == "number":
			got = "a " + got
		case strings.HasPrefix(got, "number "):
			got = strings.TrimPrefix(got, "number ") + ", out of range"
		}
		msg := "want " + jsonKind(te.Type) + ", got " + got
		if te.Field != "" {
			msg = fmt.Sprintf("field %q: %s", te.Field, msg)
		}
		return &jsonProblem{msg: msg, err: err}
	case errors.As(err, &se):
		return &jsonProblem{msg: fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error()), err: err}
	}
	return err
}

// jsonKind names the JSON values a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer ≥ 0"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a value"
}

type jsonProblem struct {
	msg string
	err error
}

func (e *jsonProblem) Error() string { return e.msg }
func (e *jsonProblem) Unwrap() error { return e.err }
