package testhooks_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/residency-go/residency/internal/testhooks"
)

func TestWithAndFrom(t *testing.T) {
	assert.Nil(t, testhooks.From(context.Background()).AfterLedger, "a plain context carries no hooks")
	var got string
	ctx := testhooks.With(context.Background(), testhooks.Hooks{AfterLedger: func(kind string) { got = kind }})
	testhooks.From(ctx).AfterLedger("Register")
	assert.Equal(t, "Register", got)
}
