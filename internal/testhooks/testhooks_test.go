package testhooks_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/system"
)

// With reaches the options' knobs only through the setter package system
// installs; a value of another type is refused.
func TestWithSetsSystemOptions(t *testing.T) {
	opts := testhooks.With(system.Options{ManagerID: "m"}, testhooks.Knobs{AfterLedger: func(string) {}})
	assert.Equal(t, "m", opts.ManagerID, "the other options are kept")
	assert.Panics(t, func() { testhooks.With(42, testhooks.Knobs{}) })
}
