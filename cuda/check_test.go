package cuda_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
)

var check = cuda.Checker{Prefix: "test backend"}

func TestCheckerConfig(t *testing.T) {
	names, err := check.Config([]string{"pageable-host", "cuda:1@n"}, map[string]int64{"cuda:1@n": 5})
	require.NoError(t, err)
	assert.Equal(t, []cuda.LocationName{{Kind: cuda.KindPageableHost}, {Kind: cuda.KindCUDA, Device: 1, Node: "n"}}, names)

	for name, c := range map[string]struct {
		locs []string
		capa map[string]int64
		want string
	}{
		"none":      {nil, nil, "cuda: invalid argument: test backend: no locations configured"},
		"malformed": {[]string{"gpu:0"}, nil, `test backend: cuda: malformed location "gpu:0": want pageable-host, pinned-host or cuda:N`},
		"twice":     {[]string{"cuda:0", "cuda:0"}, nil, `cuda: invalid argument: test backend: location "cuda:0" configured twice`},
		"capacity":  {[]string{"cuda:0"}, map[string]int64{"cuda:1": 1}, `cuda: invalid argument: test backend: capacity given for "cuda:1", which is not in Locations`},
		"negative":  {[]string{"cuda:0"}, map[string]int64{"cuda:0": -1}, "cuda: invalid argument: test backend: negative capacity -1 for cuda:0"},
	} {
		_, err := check.Config(c.locs, c.capa)
		assert.ErrorIs(t, err, cuda.ErrInvalid, name)
		assert.EqualError(t, err, c.want, name)
	}
}

type buf struct {
	loc  string
	size int64
}

func (b *buf) Location() string { return b.loc }
func (b *buf) Size() int64      { return b.size }

type ev struct{ cuda.Event }

func TestCheckerArguments(t *testing.T) {
	a, b := &buf{"cuda:0", 8}, &buf{"cuda:0", 9}
	assert.ErrorIs(t, check.Unconfigured("cuda:7"), cuda.ErrUnknownLocation)
	var le *cuda.LocationError
	assert.ErrorAs(t, check.Unconfigured("cuda:07"), &le)
	assert.ErrorIs(t, check.Foreign("copy source", nil, false), cuda.ErrInvalid)
	assert.ErrorIs(t, check.Size("cuda:0", 0), cuda.ErrInvalid)
	assert.NoError(t, check.Size("cuda:0", 1))
	assert.ErrorIs(t, check.Copy(a, a), cuda.ErrInvalid)
	assert.ErrorIs(t, check.Copy(a, b), cuda.ErrInvalid)
	assert.NoError(t, check.Copy(a, &buf{"pinned-host", 8}))
	assert.ErrorIs(t, check.Write(a, 7), cuda.ErrInvalid)
	assert.NoError(t, check.Write(a, 8))
	assert.ErrorIs(t, check.Loader(nil), cuda.ErrInvalid)
	assert.NoError(t, check.LoadTarget(""))
	assert.ErrorIs(t, check.LoadTarget("gpu:0"), cuda.ErrInvalid)
	assert.ErrorIs(t, check.Event(nil), cuda.ErrInvalid)
	assert.ErrorIs(t, check.Event((*ev)(nil)), cuda.ErrInvalid)
	assert.NoError(t, check.Event(&ev{}))
}

func TestCheckerRunLoader(t *testing.T) {
	ctx := context.Background()
	cause := errors.New("disk on fire")
	err := check.RunLoader(ctx, func(context.Context, []byte) error { return cause }, make([]byte, 4), "pinned-host", "cuda:0")
	assert.ErrorIs(t, err, cause)
	assert.EqualError(t, err, "test backend: loading 4 bytes at pinned-host for cuda:0: disk on fire")
	err = check.RunLoader(ctx, func(context.Context, []byte) error { panic("boom") }, nil, "pinned-host", "cuda:0")
	var lp *cuda.LoaderPanicError
	require.ErrorAs(t, err, &lp)
	assert.Equal(t, "boom", lp.Value)
	assert.NotEmpty(t, lp.Stack)
}
