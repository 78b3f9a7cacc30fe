package kvtrace

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Series is one line of a plot: a name, a colour (any SVG colour) and a
// dash pattern ("" for a solid line), and one y per x of the plot.
type Series struct {
	Name  string
	Color string
	Dash  string
	Y     []float64
}

// Plot writes an SVG line chart of hit ratios (y from 0 to 1) against
// capacities (x, on a logarithmic axis when they span more than a factor
// of 4), one line with markers per series, a legend, and title above.
// xs must be positive and ascending; every series has one y per x.
// A small hand-written SVG: no dependency, readable in any browser.
func Plot(w io.Writer, title, xlabel string, xs []float64, series []Series) error {
	if len(xs) == 0 {
		return fmt.Errorf("plot: no capacity")
	}
	for i, x := range xs {
		if !(x > 0) || (i > 0 && x <= xs[i-1]) {
			return fmt.Errorf("plot: capacities must be positive and ascending, got %v", xs)
		}
	}
	for _, s := range series {
		if len(s.Y) != len(xs) {
			return fmt.Errorf("plot: series %q has %d points for %d capacities", s.Name, len(s.Y), len(xs))
		}
	}
	const width, height = 720.0, 440.0
	const left, right, top, bottom = 70.0, 230.0, 50.0, 60.0
	pw, ph := width-left-right, height-top-bottom
	logX := xs[len(xs)-1]/xs[0] > 4
	fx := func(x float64) float64 {
		lo, hi := xs[0], xs[len(xs)-1]
		if lo == hi {
			return left + pw/2
		}
		if logX {
			return left + pw*(math.Log(x)-math.Log(lo))/(math.Log(hi)-math.Log(lo))
		}
		return left + pw*(x-lo)/(hi-lo)
	}
	fy := func(y float64) float64 { return top + ph*(1-math.Max(0, math.Min(1, y))) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for i := 0; i <= 10; i += 2 { // y grid and labels
		y := fy(float64(i) / 10)
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+pw, y)
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end" dominant-baseline="middle">%.1f</text>`+"\n", left-6, y, float64(i)/10)
	}
	for _, x := range xs { // x ticks
		px := fx(x)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`+"\n", px, top, px, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", px, top+ph+18, shortNumber(x))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444"/>`+"\n", left, top, pw, ph)
	axis := xlabel
	if logX {
		axis += " (log scale)"
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", left+pw/2, height-16, html.EscapeString(axis))
	fmt.Fprintf(&b, `<text transform="translate(18 %g) rotate(-90)" text-anchor="middle">block hit ratio</text>`+"\n", top+ph/2)
	for i, s := range series {
		col := html.EscapeString(s.Color)
		dash := ""
		if s.Dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, html.EscapeString(s.Dash))
		}
		pts := make([]string, len(xs))
		for j, x := range xs {
			pts[j] = fmt.Sprintf("%.1f,%.1f", fx(x), fy(s.Y[j]))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), col, dash)
		for j, x := range xs {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %.3f at %s</title></circle>`+"\n",
				fx(x), fy(s.Y[j]), col, html.EscapeString(s.Name), s.Y[j], shortNumber(x))
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"%s/>`+"\n", left+pw+14, ly, left+pw+40, ly, col, dash)
		fmt.Fprintf(&b, `<text x="%g" y="%g" dominant-baseline="middle">%s</text>`+"\n", left+pw+46, ly, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// shortNumber writes x as 950, 3k, 1.5k, 10k, 2M.
func shortNumber(x float64) string {
	switch {
	case x >= 1e6:
		return trimZero(x/1e6) + "M"
	case x >= 1e3:
		return trimZero(x/1e3) + "k"
	}
	return trimZero(x)
}

func trimZero(x float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", x), "0"), ".")
}
