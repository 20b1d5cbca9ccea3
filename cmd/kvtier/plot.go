package main

import (
	"errors"
	"fmt"
	"image/color"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvtier/kvtier/host/replay"
)

// writePlot draws token hit rate against capacity from the results of a
// sweep — one curve per policy, the Belady bound as a dashed curve and the
// infinite bound as a horizontal line — and writes it as prefix.png and
// prefix.svg. It returns the files written. It lives in the CLI, not in
// host/replay, because replay never writes output; the CLI does.
func writePlot(results []replay.Result, title, prefix string) ([]string, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "capacity (tokens, log scale)"
	p.Y.Label.Text = "token hit rate (%)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = tokenTicks{}
	p.Y.Min, p.Y.Max = 0, 100
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())

	var names []string
	curves := map[string]plotter.XYs{}
	var infinite *replay.Result
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

// tokenTicks marks a log-scale axis of token counts as plot.LogTicks
// does, with labels such as 10K and 1M instead of 10000 and 1e+06.
type tokenTicks struct{}

// Ticks implements plot.Ticker.
func (tokenTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.LogTicks{Prec: -1}.Ticks(min, max)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = replay.CapacityLabel(int64(math.Round(t.Value)))
		}
	}
	return ticks
}

// defaultPlotPrefix is --plot's default: plots/replay-sweep in the working
// directory. Its one directory, plots/, is the only one the CLI creates.
var defaultPlotPrefix = filepath.Join("plots", "replay-sweep")

// checkPlotPrefix refuses a --plot prefix that cannot be written without
// creating directories the user did not ask for: its directory must exist
// and be a directory. The default prefix is exempt (its plots/ directory is
// created on write, one level, in the working directory). It runs before
// the replay, so a typo costs nothing.
func checkPlotPrefix(prefix string, explicit bool) error {
	if !explicit {
		return nil
	}
	if prefix == "" {
		return errors.New("--plot: empty prefix; give a file prefix such as plots/sweep")
	}
	if base := filepath.Base(prefix); strings.HasSuffix(prefix, string(filepath.Separator)) || base == "." || base == ".." {
		return fmt.Errorf("--plot %q names a directory; give a file prefix inside it such as %s", prefix, filepath.Join(prefix, "sweep"))
	}
	dir := filepath.Dir(prefix)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("--plot %q: directory %s does not exist (create it first; kvtier does not create directories for --plot)", prefix, dir)
	case err != nil:
		return fmt.Errorf("--plot %q: %w", prefix, err)
	case !st.IsDir():
		return fmt.Errorf("--plot %q: %s is not a directory", prefix, dir)
	}
	return nil
}

// writeSweepPlot writes the plot of a sweep to prefix.png and prefix.svg,
// creating the default prefix's plots/ directory (one level) if needed.
func writeSweepPlot(results []replay.Result, title, prefix string, explicit bool) ([]string, error) {
	if !explicit {
		if err := os.Mkdir(filepath.Dir(prefix), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("plot directory: %w", err)
		}
	}
	return writePlot(results, title, prefix)
}
