//go:build cuda

package cu

import (
	"errors"
	"fmt"
)

// Codes of the CUresults the backend treats specially.
const (
	codeOutOfMemory = 2   // CUDA_ERROR_OUT_OF_MEMORY
	codeNotReady    = 600 // CUDA_ERROR_NOT_READY
)

// Error is a failure reported by the CUDA driver, with the call that
// failed and the driver's name for the result ("CUDA_ERROR_OUT_OF_MEMORY").
// Every driver failure the backend returns is, or wraps, an *Error.
type Error struct {
	Op          string // the driver call and its subject, e.g. "cuMemAlloc(4096 B) at cuda:0"
	Code        int    // the CUresult
	Name        string // CUDA's name of Code, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Description string // the driver's description of Code
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if e.Description != "" {
		return fmt.Sprintf("cu backend: %s: %s (%s)", e.Op, name, e.Description)
	}
	return fmt.Sprintf("cu backend: %s: %s", e.Op, name)
}

func resultError(code int) *Error {
	name, desc := errorName(code)
	return &Error{Code: code, Name: name, Description: desc}
}

// wrap turns an error of gorgonia.org/cu, or of this package's driver
// calls, into an *Error naming op. nil stays nil; other errors are wrapped
// with op.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		c := *e
		c.Op = op
		return &c
	}
	if code, ok := resultCode(err); ok {
		e = resultError(code)
		e.Op = op
		return e
	}
	return fmt.Errorf("cu backend: %s: %w", op, err)
}

// isCode reports whether err is an *Error with the given CUresult.
func isCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
