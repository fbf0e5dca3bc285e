package rollout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// TestNoOperationOrActionLiterals: an operation's or an action's name is
// written once, as its constant (Operation and Action here, the *Action
// constants of pkg/progress); everywhere else it is the constant. It reads
// the module's Go files (tests aside) and fails on a string literal equal to
// one of those names where it stands for one: compared (== or !=, a switch
// case), given as a field or variable named Action or Operation, or passed
// as a parameter named action or operation. The same word as a verb's or a
// flag's name, or inside a sentence, is another thing and passes.
func TestNoOperationOrActionLiterals(t *testing.T) {
	names := map[string]bool{}
	for _, a := range actionConstants(t) {
		names[string(a)] = true
	}
	for _, op := range []Operation{UpgradeOperation, ScaleOperation, ReplaceOperation, RolloutOperation, RestartOperation, PauseOperation} {
		names[string(op)] = true
	}
	for _, a := range []string{progress.SummaryAction, progress.ErrorAction, progress.FleetAction, progress.ConnectAction} {
		names[a] = true
	}

	fset := token.NewFileSet()
	var files []*ast.File
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		files = append(files, f)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// The positions of the parameters named action or operation, by the
	// name of their function or (interface) method.
	params := map[string][]int{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				params[n.Name.Name] = append(params[n.Name.Name], namedParams(n.Type)...)
			case *ast.InterfaceType:
				for _, m := range n.Methods.List {
					if ft, ok := m.Type.(*ast.FuncType); ok && len(m.Names) == 1 {
						params[m.Names[0].Name] = append(params[m.Names[0].Name], namedParams(ft)...)
					}
				}
			}
			return true
		})
	}

	var found []string
	check := func(e ast.Expr, where string) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return
		}
		if s, err := strconv.Unquote(lit.Value); err == nil && names[s] {
			found = append(found, fset.Position(lit.Pos()).String()+": "+lit.Value+" "+where)
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if n.Op == token.EQL || n.Op == token.NEQ {
					check(n.X, "compared")
					check(n.Y, "compared")
				}
			case *ast.CaseClause:
				for _, e := range n.List {
					check(e, "as a case")
				}
			case *ast.KeyValueExpr:
				if actionOrOperation(n.Key) {
					check(n.Value, "as a field")
				}
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					if actionOrOperation(l) && len(n.Rhs) == len(n.Lhs) {
						check(n.Rhs[i], "assigned")
					}
				}
			case *ast.CallExpr:
				for _, i := range params[calleeName(n)] {
					if i < len(n.Args) {
						check(n.Args[i], "as an argument")
					}
				}
			}
			return true
		})
	}
	slices.Sort(found)
	for _, f := range slices.Compact(found) {
		t.Errorf("%s: use the constant", f)
	}
}

// namedParams are the positions of ft's parameters named action or operation.
func namedParams(ft *ast.FuncType) []int {
	var at []int
	i := 0
	for _, field := range ft.Params.List {
		if len(field.Names) == 0 {
			i++
			continue
		}
		for _, name := range field.Names {
			if name.Name == "action" || name.Name == "operation" {
				at = append(at, i)
			}
			i++
		}
	}
	return at
}

// actionOrOperation reports whether e names a field or variable Action or
// Operation.
func actionOrOperation(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name == "Action" || e.Name == "Operation"
	case *ast.SelectorExpr:
		return e.Sel.Name == "Action" || e.Sel.Name == "Operation"
	}
	return false
}

// calleeName is the name of the function or method a call calls.
func calleeName(call *ast.CallExpr) string {
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		return fn.Name
	case *ast.SelectorExpr:
		return fn.Sel.Name
	}
	return ""
}
