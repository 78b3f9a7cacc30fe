package kvtrace

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPlotWritesWellFormedSVG(t *testing.T) {
	var b strings.Builder
	xs := []float64{1000, 3000, 10000}
	require.NoError(t, Plot(&b, "hits <&> misses", "GPU capacity (blocks)", xs, []Series{
		{Name: "residency", Color: "#1f77b4", Y: []float64{0.1, 0.2, 0.4}},
		{Name: "LRU", Color: "#ff7f0e", Dash: "6 4", Y: []float64{0.08, 0.19, 1.5}},
	}))
	svg := b.String()
	dec := xml.NewDecoder(strings.NewReader(svg))
	lines, circles := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "polyline":
				lines++
			case "circle":
				circles++
			}
		}
	}
	require.Equal(t, 2, lines)
	require.Equal(t, 6, circles)
	require.Contains(t, svg, "hits &lt;&amp;&gt; misses")
	require.Contains(t, svg, "(log scale)")
	require.Contains(t, svg, ">10k<")
	require.Contains(t, svg, `stroke-dasharray="6 4"`)
	require.Contains(t, svg, `<title>LRU: 1.500 at 10k</title>`, "a point keeps its value; the line is clipped to the axis")
}

func TestPlotRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		xs []float64
		s  []Series
	}{
		{nil, nil},
		{[]float64{2, 1}, nil},
		{[]float64{0, 1}, nil},
		{[]float64{1, 2}, []Series{{Name: "a", Y: []float64{1}}}},
	} {
		require.Error(t, Plot(io.Discard, "t", "x", c.xs, c.s), "%v", c.xs)
	}
	require.NoError(t, Plot(io.Discard, "one point", "x", []float64{5}, []Series{{Name: "a", Y: []float64{0.5}}}))
}
