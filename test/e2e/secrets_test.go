package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// The tool holds the cluster's etcd CA key and mints client keys from it. None
// of that may reach a file, the JSON events or the messages: a full upgrade and
// a status, run with a home, temp, cache and config directory of their own,
// leave no key material in any of them nor in their output.
func TestNoKeyMaterialWrittenOrPrinted(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ca := &corev1.Secret{}
	if err := e.Sim.ManagementClient().Get(ctx, etcdCAKey(e), ca); err != nil {
		t.Fatal(err)
	}
	onDisk, inOutput := keyNeedles(t, ca.Data[secret.TLSKeyDataName])
	selfCheck(t, onDisk, inOutput)

	dirs := freshDirs(t)
	r := isolated(t, e, ctx, dirs, "upgrade", "demo", "--version", to, "-o", "json")
	if r.Code != 0 {
		t.Fatalf("upgrade: exit %d", r.Code)
	}
	if events := jsonLines(r.Stdout); events < 10 {
		t.Errorf("upgrade -o json printed %d JSON events; the check below needs the real stream", events)
	}
	assertConverged(t, e, 3, to)
	checkOutput(t, "upgrade", r, inOutput)

	r = isolated(t, e, ctx, dirs, "status", "demo", "-o", "json")
	if r.Code != 0 || !json.Valid([]byte(r.Stdout)) {
		t.Fatalf("status -o json: exit %d\n%s", r.Code, r.Stdout)
	}
	checkOutput(t, "status", r, inOutput)

	leaked, files := leaksUnder(t, dirs.all(), onDisk)
	for _, leak := range leaked {
		t.Error(leak)
	}
	t.Logf("the runs left %d files in their directories", files)
}

// keyNeedles are what must never appear: on disk, any PEM private key and the
// etcd CA key in every encoding a careless write would use; in the output also
// any certificate, PEM or base64-encoded PEM (how JSON renders []byte).
func keyNeedles(t *testing.T, caKeyPEM []byte) (onDisk, inOutput []string) {
	t.Helper()
	block, _ := pem.Decode(caKeyPEM)
	if block == nil {
		t.Fatal("the etcd CA Secret holds no PEM key")
	}
	onDisk = []string{
		"PRIVATE KEY",
		string(caKeyPEM),
		base64.StdEncoding.EncodeToString(caKeyPEM),
		string(block.Bytes),
		base64.StdEncoding.EncodeToString(block.Bytes),
	}
	inOutput = append(append([]string{}, onDisk...),
		"BEGIN CERTIFICATE",
		base64.StdEncoding.EncodeToString([]byte("-----BEGIN"))[:12], // any base64'd PEM
	)
	return onDisk, inOutput
}

// selfCheck proves the scanners find what they look for, so a clean result
// means something.
func selfCheck(t *testing.T, onDisk, inOutput []string) {
	t.Helper()
	dir := t.TempDir()
	nested := filepath.Join(dir, "a", "b")
	if err := os.MkdirAll(nested, 0o700); err != nil {
		t.Fatal(err)
	}
	if got, _ := leaksUnder(t, []string{dir}, onDisk); len(got) != 0 {
		t.Fatalf("self-check: an empty directory leaks %v", got)
	}
	for i, needle := range onDisk {
		planted := filepath.Join(nested, "planted")
		if err := os.WriteFile(planted, []byte("x\n"+needle+"\ny"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, _ := leaksUnder(t, []string{dir}, onDisk); len(got) == 0 {
			t.Fatalf("self-check: the scan misses disk needle %d in %s", i, planted)
		}
	}
	for i, needle := range inOutput {
		if !leaks(`{"message":"`+needle+`"}`, inOutput) {
			t.Fatalf("self-check: the output check misses needle %d", i)
		}
	}
	if leaks(`{"action":"create","machine":"demo-abc12"}`, inOutput) {
		t.Fatal("self-check: an ordinary event counts as a leak")
	}
}

func leaks(s string, needles []string) bool {
	for _, n := range needles {
		if strings.Contains(s, n) {
			return true
		}
	}
	return false
}

// leaksUnder names every file under roots that holds a needle, and counts the
// files it read.
func leaksUnder(t *testing.T, roots []string, needles []string) (found []string, files int) {
	t.Helper()
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			if leaks(string(raw), needles) {
				found = append(found, "key material in "+path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return found, files
}

func checkOutput(t *testing.T, verb string, r simtest.Result, needles []string) {
	t.Helper()
	if leaks(r.Stdout, needles) {
		t.Errorf("%s: key or certificate material on stdout", verb)
	}
	if leaks(r.Stderr, needles) {
		t.Errorf("%s: key or certificate material on stderr", verb)
	}
}

func jsonLines(s string) int {
	n := 0
	for _, line := range strings.Split(s, "\n") {
		if json.Valid([]byte(line)) {
			n++
		}
	}
	return n
}

// isolatedDirs are the directories a run may write to: its own home, temp,
// cache and config directories and its working directory.
type isolatedDirs struct{ home, tmp, cache, config, work string }

func freshDirs(t *testing.T) isolatedDirs {
	return isolatedDirs{home: t.TempDir(), tmp: t.TempDir(), cache: t.TempDir(), config: t.TempDir(), work: t.TempDir()}
}

func (d isolatedDirs) all() []string { return []string{d.home, d.tmp, d.cache, d.config, d.work} }

// isolated runs the plugin like env.Plugin does, with dirs in place of the
// developer's: later entries in Env win, so these override Command's.
func isolated(t *testing.T, e *env, ctx context.Context, dirs isolatedDirs, args ...string) simtest.Result {
	t.Helper()
	cmd := e.Command(t, ctx, args...)
	cmd.Env = append(cmd.Env, "HOME="+dirs.home, "TMPDIR="+dirs.tmp, "XDG_CACHE_HOME="+dirs.cache, "XDG_CONFIG_HOME="+dirs.config)
	cmd.Dir = dirs.work
	return simtest.Run(t, cmd, args)
}
