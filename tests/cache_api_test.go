package tests

import (
	"go/importer"
	"go/token"
	"go/types"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A user imports system and system/cache only: every exported field of
// every exported type of both packages (aliased types included) has a
// type that one of them names — a type of its own, an alias it exports,
// or a type of another module or of the standard library — never one
// only package budget, cuda, messages or another package of this module
// names.
func TestCacheAPIFieldsNeedOnlySystemAndCache(t *testing.T) {
	const module = "github.com/residency-go/residency"
	imp := importer.ForCompiler(token.NewFileSet(), "source", nil)
	var pkgs []*types.Package
	for _, path := range []string{module + "/system", module + "/system/cache"} {
		p, err := imp.Import(path)
		require.NoError(t, err)
		pkgs = append(pkgs, p)
	}
	// What a user can name: the types of both packages and the targets of
	// their exported aliases.
	nameable := map[*types.TypeName]bool{}
	for _, p := range pkgs {
		for _, n := range p.Scope().Names() {
			if tn, ok := p.Scope().Lookup(n).(*types.TypeName); ok && tn.Exported() {
				if nt, ok := types.Unalias(tn.Type()).(*types.Named); ok {
					nameable[nt.Obj()] = true
				}
			}
		}
	}
	var bad []string
	var visit func(where string, ty types.Type)
	visit = func(where string, ty types.Type) {
		switch x := types.Unalias(ty).(type) {
		case *types.Named:
			o := x.Obj()
			if o.Pkg() != nil && strings.HasPrefix(o.Pkg().Path(), module+"/") && !nameable[o] {
				bad = append(bad, where+": "+o.Pkg().Path()+"."+o.Name())
			}
			for i := 0; i < x.TypeArgs().Len(); i++ {
				visit(where, x.TypeArgs().At(i))
			}
		case *types.Pointer:
			visit(where, x.Elem())
		case *types.Slice:
			visit(where, x.Elem())
		case *types.Array:
			visit(where, x.Elem())
		case *types.Map:
			visit(where, x.Key())
			visit(where, x.Elem())
		case *types.Chan:
			visit(where, x.Elem())
		}
	}
	fields := 0
	for _, p := range pkgs {
		for _, n := range p.Scope().Names() {
			tn, ok := p.Scope().Lookup(n).(*types.TypeName)
			if !ok || !tn.Exported() {
				continue
			}
			st, ok := types.Unalias(tn.Type()).Underlying().(*types.Struct)
			if !ok {
				continue
			}
			for i := 0; i < st.NumFields(); i++ {
				if f := st.Field(i); f.Exported() {
					fields++
					visit(p.Name()+"."+n+"."+f.Name(), f.Type())
				}
			}
		}
	}
	assert.Greater(t, fields, 100, "the walk found the exported fields")
	assert.Empty(t, bad, "fields whose type a user must import another package of the module to name")
}
