package cli

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/liggitt/tabwriter"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/duration"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/util/jsonpath"

	"sigs.k8s.io/yaml"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// This file is how the verbs print, as kubectl get prints: every table goes
// through cli-runtime's table printer (-o wide's columns, --no-headers);
// status's -o name, jsonpath and go-template are cli-runtime's printers, and
// its custom-columns is that table printer over client-go's JSONPath, as
// kubectl's own custom-columns is. All of them read the JSON -o json prints.
// genericclioptions.PrintFlags, which binds these formats to -o for kubectl,
// is not used: importing its package links cli-runtime's resource builder
// and kustomize, which kubeconfigFlags keeps out of the binary for the same
// reason; the printers package alone adds a tabwriter and a terminal helper.

// The -o values of each verb, one vocabulary: a value means the same on
// every verb that takes it, and a verb takes every value it can print
// through printFlags.print. Those ending in "=" take a template after it.
var (
	// statusOutputs are status's (and check's): tables with rows to name
	// and to select columns of.
	statusOutputs = []string{"text", "wide", "json", "yaml", "name", "jsonpath=", "go-template=", "custom-columns="}
	// planOutputs are plan's: its rows are steps, which are not objects of
	// the API, so it has no -o name.
	planOutputs = []string{"text", "wide", "json", "yaml", "jsonpath=", "go-template=", "custom-columns="}
	// objectOutputs are those of a verb that prints one object and no
	// table (version, handback, wait).
	objectOutputs = []string{"text", "json", "yaml", "jsonpath=", "go-template="}
	// requestOutputs are the run verbs': their json is an event stream,
	// JSON Lines, not one object, so no format that reads one applies.
	requestOutputs = []string{"text", "json"}
)

// outputValuesAnnotation records, on a verb's -o flag, the values that
// verb takes: applyConfig reads it to tell a configured value that this
// verb cannot print (ignored) from one that no verb prints (refused).
const outputValuesAnnotation = "cp-rollout/output-values"

// addOutputFlag is every verb's -o: bound to output, completed from values
// and annotated with them.
func addOutputFlag(cmd *cobra.Command, output *string, values []string, usage string) {
	cmd.Flags().StringVarP(output, "output", "o", *output, usage)
	_ = cmd.Flags().SetAnnotation("output", outputValuesAnnotation, values)
	completeOutput(cmd, values)
}

// acceptsOutput says whether value is one of values; a templated value
// (jsonpath={.x}) by what comes before its "=".
func acceptsOutput(values []string, value string) bool {
	if format, _, templated := strings.Cut(value, "="); templated {
		return slices.Contains(values, format+"=")
	}
	return slices.Contains(values, value)
}

// printFlags are a verb's -o (and status's and check's --no-headers and
// --sort-by), and what complete makes of them.
type printFlags struct {
	Output    string
	NoHeaders bool
	SortBy    string
	// values are the verb's -o values (statusOutputs, planOutputs …).
	values []string

	format   string                   // Output before "=": text, wide, json, … custom-columns
	template printers.ResourcePrinter // -o jsonpath= and go-template=
	columns  []customColumn           // -o custom-columns=
	sortBy   *jsonpath.JSONPath       // --sort-by
}

// complete parses -o, its template and --sort-by's expression, so that a
// bad one is refused (exit 2) before anything is read.
func (p *printFlags) complete() error {
	format, arg, templated := strings.Cut(p.Output, "=")
	if !acceptsOutput(p.values, p.Output) {
		return oneOf("output", p.Output, p.values...)
	}
	p.format = format
	if templated && arg == "" {
		return exitcode.Usagef("-o %s= needs a template after the =", format)
	}
	var err error
	switch p.format {
	case "jsonpath":
		var jp *printers.JSONPathPrinter
		if jp, err = printers.NewJSONPathPrinter(arg); err == nil {
			jp.AllowMissingKeys(true) // as kubectl's default
			p.template = jp
		}
	case "go-template":
		var gt *printers.GoTemplatePrinter
		if gt, err = printers.NewGoTemplatePrinter([]byte(arg)); err == nil {
			gt.AllowMissingKeys(true)
			p.template = gt
		}
	case "custom-columns":
		p.columns, err = parseCustomColumns(arg)
	}
	if err != nil {
		return exitcode.Usagef("-o %s: %s", p.Output, oneLine(err))
	}
	if p.SortBy != "" {
		if p.sortBy, err = relaxedJSONPath("sort-by", p.SortBy); err != nil {
			return exitcode.Usagef("--sort-by %s: %s", p.SortBy, oneLine(err))
		}
	}
	return nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// jsonPathField is what kubectl's custom-columns and --sort-by take: a field
// path with or without its leading dot and braces (name, .name, {.name}).
var jsonPathField = regexp.MustCompile(`^\{\.?([^{}]+)\}$|^\.?([^{}]+)$`)

// relaxedJSONPath parses a field path as kubectl's RelaxedJSONPathExpression
// reads it; a missing field finds nothing rather than failing.
func relaxedJSONPath(name, expr string) (*jsonpath.JSONPath, error) {
	m := jsonPathField.FindStringSubmatch(expr)
	if m == nil {
		return nil, fmt.Errorf("want a field path such as .name, name or {.name}")
	}
	field := m[1] + m[2] // one of them is empty
	jp := jsonpath.New(name).AllowMissingKeys(true)
	return jp, jp.Parse("{." + field + "}")
}

// customColumn is one HEADER:FIELD of -o custom-columns.
type customColumn struct {
	header string
	field  *jsonpath.JSONPath
}

// parseCustomColumns reads kubectl's custom-columns spec,
// HEADER:FIELD[,HEADER:FIELD…].
func parseCustomColumns(spec string) ([]customColumn, error) {
	var columns []customColumn
	for i, part := range strings.Split(spec, ",") {
		header, field, ok := strings.Cut(part, ":")
		if !ok || header == "" {
			return nil, fmt.Errorf("column %q: want HEADER:FIELD, such as NAME:.name", part)
		}
		jp, err := relaxedJSONPath(fmt.Sprintf("column%d", i), field)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", header, err)
		}
		columns = append(columns, customColumn{header: header, field: jp})
	}
	return columns, nil
}

// jsonObject is v's JSON, as -o json prints it, for JSONPath and the
// templates to read; numbers stay integers, as in a Kubernetes object.
func jsonObject(v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	obj := map[string]any{}
	return obj, utiljson.Unmarshal(raw, &obj)
}

// printName prints a row as -o name does: kind.group/name, as kubectl get
// -o name prints the Machine or Cluster.
func printName(w io.Writer, kind, name string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(clusterv1.GroupVersion.WithKind(kind))
	u.SetName(name)
	return (&printers.NamePrinter{}).PrintObj(u, w)
}

// cellOf is what a custom column shows of obj: every value its field finds,
// comma-separated, or <none>, as kubectl's custom-columns.
func cellOf(c customColumn, obj map[string]any) (string, error) {
	found, err := c.field.FindResults(obj)
	if err != nil {
		return "", err
	}
	var values []string
	for _, list := range found {
		for _, v := range list {
			values = append(values, fmt.Sprint(v.Interface()))
		}
	}
	if len(values) == 0 {
		return "<none>", nil
	}
	return strings.Join(values, ","), nil
}

// sortRows orders rows, stably, by what --sort-by finds in each one's JSON:
// numbers by value, other values by their text, a row where it finds
// nothing first.
func sortRows[T any](rows []T, by *jsonpath.JSONPath) error {
	keys := make(map[int]any, len(rows))
	for i := range rows {
		obj, err := jsonObject(rows[i])
		if err != nil {
			return err
		}
		found, err := by.FindResults(obj)
		if err != nil {
			return fmt.Errorf("--sort-by: %w", err)
		}
		if len(found) > 0 && len(found[0]) > 0 {
			keys[i] = found[0][0].Interface()
		}
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return compareValues(keys[a], keys[b]) })
	sorted := make([]T, len(rows))
	for i, j := range order {
		sorted[i] = rows[j]
	}
	copy(rows, sorted)
	return nil
}

func compareValues(a, b any) int {
	if a == nil || b == nil {
		return cmp.Compare(boolInt(a != nil), boolInt(b != nil))
	}
	if x, ok := number(a); ok {
		if y, ok := number(b); ok {
			return cmp.Compare(x, y)
		}
	}
	return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// newTabWriter is what every table and status's KEY value lines are printed
// into: columns two spaces apart, the layout the verbs have always had.
// cli-runtime's table printer uses a tabwriter it is handed (its own pads
// three), so every table of one command lines up the same way.
func newTabWriter(out io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
}

// tableOptions are the table printer's options: -o wide's columns
// (Priority 1) and --no-headers.
type tableOptions = printers.PrintOptions

// printTable prints rows under columns with cli-runtime's table printer,
// which upper-cases the column names, prints Priority 1 columns only with
// Wide, no header line with NoHeaders (nor for a table without rows), and
// cuts a cell at its first newline.
func printTable(w *tabwriter.Writer, columns []metav1.TableColumnDefinition, rows [][]any, opts tableOptions) error {
	t := &metav1.Table{ColumnDefinitions: columns}
	for _, cells := range rows {
		t.Rows = append(t.Rows, metav1.TableRow{Cells: cells})
	}
	return printers.NewTablePrinter(opts).PrintObj(t, w)
}

// tableColumns defines a table's columns: each name always shown, wide only with
// -o wide.
func tableColumns(names []string, wide ...string) []metav1.TableColumnDefinition {
	defs := make([]metav1.TableColumnDefinition, 0, len(names)+len(wide))
	for _, n := range names {
		defs = append(defs, metav1.TableColumnDefinition{Name: n, Type: "string"})
	}
	for _, n := range wide {
		defs = append(defs, metav1.TableColumnDefinition{Name: n, Type: "string", Priority: 1})
	}
	return defs
}

// age is how long ago t was, as kubectl's AGE column says it (26h, not
// 26h3m12s).
func age(t, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

// writeJSON writes v as -o json prints an object: indented, or with oneLine
// compact on a line of its own, the form over several clusters and under -w
// (JSON Lines).
func writeJSON(w io.Writer, v any, oneLine bool) error {
	enc := json.NewEncoder(w)
	if !oneLine {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// printable is what a verb with the printers shows: the objects -o json,
// yaml, jsonpath and go-template print, each in turn, and the rows -o name
// and custom-columns print a line each.
type printable interface {
	docs() []doc
	rowSet() []row
}

// doc is one object a verb shows; id names it from one read to the next.
type doc struct {
	id string
	v  any
}

// row is one line of custom-columns and -o name, and what --sort-by
// orders.
type row struct {
	kind, name string
	v          any
}

// print prints v as -o asks; table prints the text and wide formats.
// jsonLines prints -o json as JSON Lines, a doc a line, and -o yaml as one
// list: what a verb shows of several clusters.
func (p *printFlags) print(out io.Writer, v printable, jsonLines bool, table func(tableOptions) error) error {
	docs := v.docs()
	switch p.format {
	case "json":
		if !jsonLines && len(docs) == 1 {
			return writeJSON(out, docs[0].v, false)
		}
		for _, d := range docs {
			if err := writeJSON(out, d.v, true); err != nil {
				return err
			}
		}
		return nil
	case "yaml":
		var data any
		if !jsonLines && len(docs) == 1 {
			data = docs[0].v
		} else {
			list := make([]any, len(docs))
			for i, d := range docs {
				list[i] = d.v
			}
			data = list
		}
		raw, err := yaml.Marshal(data)
		if err != nil {
			return err
		}
		_, err = out.Write(raw)
		return err
	case "jsonpath", "go-template":
		for _, d := range docs {
			obj, err := jsonObject(d.v)
			if err != nil {
				return err
			}
			if err := p.template.PrintObj(&unstructured.Unstructured{Object: obj}, out); err != nil {
				return err
			}
		}
		return nil
	case "name":
		for _, r := range v.rowSet() {
			if err := printName(out, r.kind, r.name); err != nil {
				return err
			}
		}
		return nil
	case "custom-columns":
		return p.printCustomColumns(out, v.rowSet())
	}
	return table(tableOptions{Wide: p.format == "wide", NoHeaders: p.NoHeaders})
}

// printCustomColumns prints a line per row with -o custom-columns' cells.
func (p *printFlags) printCustomColumns(out io.Writer, rows []row) error {
	headers := make([]string, len(p.columns))
	for i, c := range p.columns {
		headers[i] = c.header
	}
	var cells [][]any
	for _, r := range rows {
		obj, err := jsonObject(r.v)
		if err != nil {
			return err
		}
		line := make([]any, len(p.columns))
		for i, c := range p.columns {
			if line[i], err = cellOf(c, obj); err != nil {
				return fmt.Errorf("-o custom-columns, column %s: %w", c.header, err)
			}
		}
		cells = append(cells, line)
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns(headers), cells, tableOptions{NoHeaders: p.NoHeaders}); err != nil {
		return err
	}
	return w.Flush()
}
