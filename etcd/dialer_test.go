package etcd_test

import (
	"strings"
	"testing"

	"github.com/cp-rollout/cp-rollout/etcd"
)

func TestDirectDialerTemplate(t *testing.T) {
	t.Parallel()
	node := etcd.Node{Name: "cp-1", IP: "10.0.0.7"}
	for tmpl, want := range map[string]string{
		"https://{{.NodeIP}}:2379":                  "https://10.0.0.7:2379",
		"https://{{.NodeIP}}":                       "https://10.0.0.7:2379",
		"https://{{.NodeName}}.etcd.example":        "https://cp-1.etcd.example:2379",
		"https://[fd00::{{.NodeName | len}}]:12379": "https://[fd00::4]:12379",
	} {
		d, err := etcd.NewDirectDialer(tmpl)
		if err != nil {
			t.Errorf("%s: %v", tmpl, err)
			continue
		}
		if got := d.Target(node); got != want {
			t.Errorf("%s renders %s, want %s", tmpl, got, want)
		}
	}
	for _, bad := range []string{"{{.NodeIP", "https://{{.Nope}}:2379", "http://{{.NodeIP}}:2379", "{{.NodeIP}}:2379", "https://:2379"} {
		if _, err := etcd.NewDirectDialer(bad); err == nil || !strings.Contains(err.Error(), "etcd endpoint") {
			t.Errorf("template %q accepted (%v)", bad, err)
		}
	}
}
