package fleet

import (
	"strings"
	"testing"
)

type named struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// A list response's keys may come in any order, its items may be null, and a
// body that is not a list is an error, not an empty list.
func TestDecodeListHandsOnEveryItemAndTheContinueToken(t *testing.T) {
	for _, tc := range []struct {
		body, names, cont string
		fails             bool
	}{
		{body: `{"apiVersion":"v1","kind":"List","metadata":{"continue":"c1"},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"},"spec":{"x":[1,2]}}]}`, names: "a,b", cont: "c1"},
		{body: `{"items":[{"metadata":{"name":"a"}}],"kind":"List","metadata":{"resourceVersion":"7"}}`, names: "a"},
		{body: `{"kind":"List","items":null,"metadata":{}}`},
		// Keys match case-sensitively, as in the API machinery.
		{body: `{"items":[{"Metadata":{"name":"a"}}]}`, names: ""},
		{body: `[{"metadata":{"name":"a"}}]`, fails: true},
		{body: `{"items":{"metadata":{"name":"a"}}}`, fails: true},
		{body: `{"items":[{"metadata":{"name":"a"}}`, fails: true},
	} {
		var names []string
		cont, err := decodeList(strings.NewReader(tc.body), func(n *named) { names = append(names, n.Metadata.Name) })
		switch {
		case tc.fails && err == nil:
			t.Errorf("%s: decoded, want an error", tc.body)
		case !tc.fails && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case !tc.fails && (strings.Join(names, ",") != tc.names || cont != tc.cont):
			t.Errorf("%s: items %q, continue %q; want %q, %q", tc.body, strings.Join(names, ","), cont, tc.names, tc.cont)
		}
	}
}
