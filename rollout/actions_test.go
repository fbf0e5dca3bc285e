package rollout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// decisionsOnly are Next's actions never reported under their own name: a
// finished run reports its summary, and serving the cleanup hook reports
// move-leader, remove-member and release.
var decisionsOnly = []Action{Done, ServeCleanupHook}

// eventsOnly are actions of the Warning Events a failed run writes, which
// no progress event carries.
var eventsOnly = []Action{StayPaused}

// TestDocumentedActionsAreTheConstants holds docs/output.md's list of event
// actions, a contract for scripts, to the Action constants the engine reports
// under: a step added, renamed or dropped in one place and not the other
// fails here.
func TestDocumentedActionsAreTheConstants(t *testing.T) {
	var inCode []string
	for _, a := range actionConstants(t) {
		if !slices.Contains(decisionsOnly, a) && !slices.Contains(eventsOnly, a) {
			inCode = append(inCode, string(a))
		}
	}
	inCode = append(inCode, progress.SummaryAction)

	doc, err := os.ReadFile("../docs/output.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `action` \\| (.*) \\|$").FindSubmatch(doc)
	if row == nil {
		t.Fatal("docs/output.md has no `action` row in its event table")
	}
	var inDoc []string
	for _, m := range regexp.MustCompile("`([a-z-]+)`").FindAllSubmatch(row[1], -1) {
		inDoc = append(inDoc, string(m[1]))
	}

	slices.Sort(inCode)
	slices.Sort(inDoc)
	if !slices.Equal(inCode, inDoc) {
		t.Errorf("docs/output.md lists actions %v;\nthe engine reports %v", inDoc, inCode)
	}
}

// actionConstants are the values of every constant of type Action this
// package declares, read from its source, so that a new one cannot be left
// out of a list kept by hand.
func actionConstants(t *testing.T) []Action {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var found []Action
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Action" {
					continue
				}
				for _, val := range v.Values {
					s, err := strconv.Unquote(val.(*ast.BasicLit).Value)
					if err != nil {
						t.Fatal(err)
					}
					found = append(found, Action(s))
				}
			}
		}
	}
	if len(found) < 10 {
		t.Fatalf("found only %d Action constants in the package's source: %v", len(found), found)
	}
	return found
}
