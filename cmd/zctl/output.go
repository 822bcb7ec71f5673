package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// writeExplanation prints e as a table (default), JSON or YAML; all three
// carry the same fields.
func writeExplanation(w io.Writer, e *explanation, format string) error {
	switch format {
	case "", "table":
	case "json":
		b, err := json.MarshalIndent(e, "", "  ")
		if err != nil {
			return fmt.Errorf("explain: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(e)
		if err != nil {
			return fmt.Errorf("explain: %w", err)
		}
		_, err = w.Write(b)
		return err
	default:
		return fmt.Errorf("unknown output format %q (want table, json or yaml)", format)
	}
	fmt.Fprintf(w, "proxy:        %s\n", e.Proxy)
	for _, wp := range e.Waypoints {
		fmt.Fprintf(w, "waypoint:     %s\n", wp)
	}
	fmt.Fprintf(w, "source:       %s\ndestination:  %s\n\n", e.Source, e.Destination)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tRESULT\tDECIDED BY\tDETAIL")
	for _, s := range e.Steps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Step, s.Result, or(s.By, "-"), or(s.Detail, "-"))
	}
	by := "-"
	if e.Policy != "" {
		by = policyRef(e.Policy)
		if e.Rule != nil {
			by += fmt.Sprintf(" rule %d", *e.Rule)
		}
	}
	fmt.Fprintf(tw, "verdict\t%s\t%s\t-\n", e.Verdict, by)
	return tw.Flush()
}
