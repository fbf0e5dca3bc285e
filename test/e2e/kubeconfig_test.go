package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/secret"
)

// Whoever may write Secrets in a Cluster's namespace writes its kubeconfig
// Secret, and the plugin runs on an operator's machine: an exec credential
// plugin put there is refused before anything could run it, even by the
// read-only status, with exit code 3 and a message naming the Secret and the
// field. The plugin's command would leave a marker file; none appears.
func TestKubeconfigSecretWithExecPluginRefused(t *testing.T) {
	e := readOnly.Use(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if r := e.Plugin(t, ctx, "status", "demo"); r.Code != 0 {
		t.Fatalf("status with the simulator's own kubeconfig Secret: exit %d, want 0", r.Code)
	}

	c := e.Sim.ManagementClient()
	key := client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: secret.Name("demo", secret.Kubeconfig)}
	orig := &corev1.Secret{}
	if err := c.Get(ctx, key, orig); err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(orig.Data[secret.KubeconfigDataName])
	if err != nil {
		t.Fatal(err)
	}
	// The user's embedded credentials go: client-go runs an exec plugin only
	// for a user that has no other credential, so this kubeconfig is one
	// whose command the tool did run before it was refused.
	marker := filepath.Join(t.TempDir(), "exec-plugin-ran")
	user := kc.Contexts[kc.CurrentContext].AuthInfo
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		Command:         "/bin/sh",
		Args:            []string{"-c", "touch " + marker},
		APIVersion:      "client.authentication.k8s.io/v1",
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}}
	tampered, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	// The simulator's Cluster API controllers connected through this Secret
	// when it started and read it again only to reconnect: the tampered
	// kubeconfig stays for this one run, and the Secret is put back even if
	// the test fails, as later scenarios and the controllers need it.
	put := func(data map[string][]byte) {
		cur := &corev1.Secret{}
		if err := c.Get(context.Background(), key, cur); err != nil {
			t.Fatal(err)
		}
		cur.Data = data
		if err := c.Update(context.Background(), cur); err != nil {
			t.Fatal(err)
		}
	}
	put(map[string][]byte{secret.KubeconfigDataName: tampered})
	t.Cleanup(func() { put(orig.Data) })

	r := e.Plugin(t, ctx, "status", "demo")
	if r.Code != 3 {
		t.Errorf("exit %d, want 3 (unsafe)", r.Code)
	}
	for _, want := range []string{"Secret " + key.String(), ".user.exec", "embedded credentials only"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.Stderr)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the exec plugin's command ran (marker %s: %v)", marker, err)
	}
}
