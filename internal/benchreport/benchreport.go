// Package benchreport formats the results of `kvtier bench` subcommands: a
// table for people, or one JSON object per line for scripts. The JSON keys
// (bench, value, unit, limit, ratio) are a public contract.
package benchreport

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// Result is one measured figure.
type Result struct {
	// Bench names the measurement, e.g. "radix/replay".
	Bench string `json:"bench"`
	// Value is the measured figure in Unit.
	Value float64 `json:"value"`
	// Unit is the unit of Value and Limit, e.g. "block-ops/s".
	Unit string `json:"unit"`
	// Limit is the reference measured in the same run (fio, memcpy, the
	// raw library, the in-process tier), or 0 when there is none.
	Limit float64 `json:"limit,omitempty"`
	// LimitName says what Limit measured.
	LimitName string `json:"limit_name,omitempty"`
	// Ratio is Value / Limit (or Limit / Value for lower-is-better units;
	// Note says so), 0 when there is no limit.
	Ratio float64 `json:"ratio,omitempty"`
	// Target is the ratio or value the project aims for, 0 if none.
	Target float64 `json:"target,omitempty"`
	// Note is free text: parameters, "no limit measured", caveats.
	Note string `json:"note,omitempty"`
}

// WithLimit returns r with Limit, LimitName and Ratio = Value/Limit set.
func (r Result) WithLimit(name string, limit float64) Result {
	r.Limit, r.LimitName = limit, name
	if limit != 0 {
		r.Ratio = r.Value / limit
	}
	return r
}

// Write prints results as a table, or as JSON lines when asJSON is set.
func Write(w io.Writer, results []Result, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return fmt.Errorf("write bench result %s: %w", r.Bench, err)
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BENCH\tVALUE\tUNIT\tLIMIT\tRATIO\tTARGET\tNOTE")
	for _, r := range results {
		limit, ratio, target := "-", "-", "-"
		if r.Limit != 0 {
			limit = fmt.Sprintf("%.4g (%s)", r.Limit, r.LimitName)
			ratio = fmt.Sprintf("%.3fx", r.Ratio)
		}
		if r.Target != 0 {
			target = fmt.Sprintf("%.4g", r.Target)
		}
		fmt.Fprintf(tw, "%s\t%.4g\t%s\t%s\t%s\t%s\t%s\n", r.Bench, r.Value, r.Unit, limit, ratio, target, r.Note)
	}
	return tw.Flush()
}
