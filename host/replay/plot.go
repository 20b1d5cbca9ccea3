package replay

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlot draws token hit rate against capacity from the results of a
// sweep — one curve per policy, the Belady bound as a dashed curve and the
// infinite bound as a horizontal line — and writes it as prefix.png and
// prefix.svg. It returns the files written.
func WritePlot(results []Result, title, prefix string) ([]string, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "capacity (tokens, log scale)"
	p.Y.Label.Text = "token hit rate (%)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 100
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())

	var names []string
	curves := map[string]plotter.XYs{}
	var infinite *Result
	var minCap, maxCap float64
	for i := range results {
		r := &results[i]
		if r.CapacityTokens == 0 {
			infinite = r
			continue
		}
		if _, ok := curves[r.Policy]; !ok {
			names = append(names, r.Policy)
		}
		x := float64(r.CapacityTokens)
		curves[r.Policy] = append(curves[r.Policy], plotter.XY{X: x, Y: 100 * r.HitRate})
		if minCap == 0 || x < minCap {
			minCap = x
		}
		maxCap = max(maxCap, x)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("plot %s: no finite-capacity results to draw", prefix)
	}
	for i, name := range names {
		xy := curves[name]
		slices.SortFunc(xy, func(a, b plotter.XY) int {
			switch {
			case a.X < b.X:
				return -1
			case a.X > b.X:
				return 1
			}
			return 0
		})
		line, points, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, fmt.Errorf("plot %s: curve %s: %w", prefix, name, err)
		}
		c := plotutil.Color(i)
		line.Color, points.Color = c, c
		points.Shape = plotutil.Shape(i)
		line.Width = vg.Points(1.5)
		if name == "belady" {
			line.Color, points.Color = color.Black, color.Black
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(line, points)
		p.Legend.Add(name, line, points)
	}
	if infinite != nil {
		inf, err := plotter.NewLine(plotter.XYs{{X: minCap, Y: 100 * infinite.HitRate}, {X: maxCap, Y: 100 * infinite.HitRate}})
		if err != nil {
			return nil, fmt.Errorf("plot %s: infinite bound: %w", prefix, err)
		}
		inf.Color = color.Gray{Y: 100}
		inf.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(inf)
		p.Legend.Add(fmt.Sprintf("infinite (%.1f%%)", 100*infinite.HitRate), inf)
	}
	var files []string
	for _, ext := range []string{".png", ".svg"} {
		f := prefix + ext
		if err := p.Save(8*vg.Inch, 5*vg.Inch, f); err != nil {
			return files, fmt.Errorf("write plot %s: %w", filepath.Clean(f), err)
		}
		files = append(files, f)
	}
	return files, nil
}
