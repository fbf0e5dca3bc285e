package readiness

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func whService(ns, name string) admissionregistrationv1.WebhookClientConfig {
	return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name}}
}

// Unset failurePolicy is Fail in admissionregistration/v1: such a webhook
// must be judged, an Ignore one must not, and each keeps its index for the
// patch the finding suggests.
func TestFailClosedOf(t *testing.T) {
	ignore, fail := admissionregistrationv1.Ignore, admissionregistrationv1.Fail
	validating := []admissionregistrationv1.ValidatingWebhookConfiguration{{
		ObjectMeta: metav1.ObjectMeta{Name: "policy"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "unset.policy.io", ClientConfig: whService("pol", "svc")},
			{Name: "ignore.policy.io", FailurePolicy: &ignore, ClientConfig: whService("pol", "svc")},
			{Name: "fail.policy.io", FailurePolicy: &fail, ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://example.invalid/v")}},
		},
	}}
	mutating := []admissionregistrationv1.MutatingWebhookConfiguration{{
		ObjectMeta: metav1.ObjectMeta{Name: "inject"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "ignore.inject.io", FailurePolicy: &ignore, ClientConfig: whService("inj", "svc")},
			{Name: "fail.inject.io", FailurePolicy: &fail, ClientConfig: whService("inj", "svc")},
		},
	}}
	got := failClosedOf(validating, mutating)
	want := []admissionWebhook{
		{Kind: "ValidatingWebhookConfiguration", Config: "policy", Index: 0, Name: "unset.policy.io", Service: types.NamespacedName{Namespace: "pol", Name: "svc"}},
		{Kind: "ValidatingWebhookConfiguration", Config: "policy", Index: 2, Name: "fail.policy.io", URL: true},
		{Kind: "MutatingWebhookConfiguration", Config: "inject", Index: 1, Name: "fail.inject.io", Service: types.NamespacedName{Namespace: "inj", Name: "svc"}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("webhook %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// slice is one EndpointSlice of the endpoints given as node:ready, with
// ready "" meaning the condition is unset and node "" no nodeName.
func whSlice(eps ...[2]string) discoveryv1.EndpointSlice {
	s := discoveryv1.EndpointSlice{}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}}
		if e[0] != "" {
			ep.NodeName = ptr.To(e[0])
		}
		if e[1] != "" {
			ep.Conditions.Ready = ptr.To(e[1] == "true")
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func TestJudgeWebhooks(t *testing.T) {
	svc := types.NamespacedName{Namespace: "pol", Name: "svc"}
	hook := admissionWebhook{Kind: "ValidatingWebhookConfiguration", Config: "policy", Index: 3, Name: "v.policy.io", Service: svc}
	cp := map[string]bool{"cp1": true, "cp2": true, "cp3": true}
	ready := func(node string) [2]string { return [2]string{node, "true"} }
	unready := func(node string) [2]string { return [2]string{node, "false"} }

	cases := []struct {
		name    string
		hooks   []admissionWebhook
		backend webhookBackend
		want    Result
		found   []string
	}{
		{name: "ready on a worker passes", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice(ready("w1"), ready("cp1"))}},
			want: Pass, found: []string{"1 webhooks with failurePolicy Fail"}},
		// Ready unset is taken as ready.
		{name: "ready unset on a worker passes", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice([2]string{"w1", ""})}},
			want: Pass},
		// The worker's endpoint is not ready, so it takes no traffic: what
		// answers is on cp1 alone, whose drain takes the webhook down.
		{name: "unready worker endpoint is ignored", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice(unready("w1"), ready("cp1"))}},
			want: Block, found: []string{"ready only on control-plane node cp1", "ValidatingWebhookConfiguration policy (webhook v.policy.io) calls service pol/svc"}},
		{name: "one control-plane node blocks, over two slices", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice(ready("cp1")), whSlice(ready("cp1"))}},
			want: Block, found: []string{"control-plane node cp1"}},
		{name: "several control-plane nodes warn", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice(ready("cp2")), whSlice(ready("cp1"))}},
			want: Warn, found: []string{"control-plane nodes cp1, cp2"}},
		{name: "no endpoint slice blocks", backend: webhookBackend{}, want: Block, found: []string{"no ready endpoint", "kubectl -n pol get pods,endpointslices"}},
		{name: "no ready endpoint blocks", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice(unready("w1"), unready("cp1"))}},
			want: Block, found: []string{"no ready endpoint"}},
		{name: "missing service blocks", backend: webhookBackend{Missing: true}, want: Block, found: []string{"does not exist"}},
		// An endpoint without a node is no pod of this cluster's nodes: no
		// drain here takes it down.
		{name: "nodeless ready endpoint passes", backend: webhookBackend{Slices: []discoveryv1.EndpointSlice{whSlice([2]string{"", "true"})}},
			want: Pass},
		{name: "ExternalName is not judged", backend: webhookBackend{ExternalName: "hooks.example.invalid"},
			want: Pass, found: []string{"not judged", "hooks.example.invalid", "no webhook with failurePolicy Fail calls a Service"}},
		{name: "url webhook is not judged", hooks: []admissionWebhook{{Kind: "MutatingWebhookConfiguration", Config: "inject", Name: "m.inject.io", URL: true}},
			want: Pass, found: []string{"not judged", "MutatingWebhookConfiguration inject webhook m.inject.io"}},
		{name: "no fail-closed webhook passes", hooks: []admissionWebhook{}, want: Pass},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hooks := tc.hooks
			if hooks == nil {
				hooks = []admissionWebhook{hook}
			}
			f := judgeWebhooks(hooks, map[types.NamespacedName]webhookBackend{svc: tc.backend}, cp)
			if f.Result != tc.want {
				t.Fatalf("result %s, want %s: %s", f.Result, tc.want, f.Found)
			}
			for _, s := range tc.found {
				if !strings.Contains(f.Found, s) && !strings.Contains(f.Do, s) {
					t.Errorf("%q not in finding:\nfound: %s\ndo: %s", s, f.Found, f.Do)
				}
			}
			if (f.Do == "") != (f.Result == Pass) {
				t.Errorf("do %q on a %s", f.Do, f.Result)
			}
			if f.Result != Pass && !strings.Contains(f.Do, `kubectl patch validatingwebhookconfiguration policy --type=json -p '[{"op":"add","path":"/webhooks/3/failurePolicy","value":"Ignore"}]'`) {
				t.Errorf("no patch of the webhook in do: %s", f.Do)
			}
		})
	}
}

// A block and a warning together block, and both are named; the webhooks
// of one configuration that call one service are named in one item.
func TestJudgeWebhooksMixed(t *testing.T) {
	a := types.NamespacedName{Namespace: "a", Name: "svc"}
	b := types.NamespacedName{Namespace: "b", Name: "svc"}
	hooks := []admissionWebhook{
		{Kind: "MutatingWebhookConfiguration", Config: "spread", Index: 0, Name: "one.io", Service: a},
		{Kind: "ValidatingWebhookConfiguration", Config: "single", Index: 0, Name: "x.io", Service: b},
		{Kind: "ValidatingWebhookConfiguration", Config: "single", Index: 1, Name: "y.io", Service: b},
	}
	f := judgeWebhooks(hooks, map[types.NamespacedName]webhookBackend{
		a: {Slices: []discoveryv1.EndpointSlice{whSlice([2]string{"cp1", "true"}, [2]string{"cp2", "true"})}},
		b: {Slices: []discoveryv1.EndpointSlice{whSlice([2]string{"cp2", "true"})}},
	}, map[string]bool{"cp1": true, "cp2": true})
	if f.Result != Block {
		t.Fatalf("result %s: %s", f.Result, f.Found)
	}
	for _, s := range []string{"ValidatingWebhookConfiguration single (webhooks x.io, y.io) calls service b/svc, ready only on control-plane node cp2",
		"MutatingWebhookConfiguration spread (webhook one.io) calls service a/svc, ready only on control-plane nodes cp1, cp2"} {
		if !strings.Contains(f.Found, s) {
			t.Errorf("%q not in %s", s, f.Found)
		}
	}
	// The patch names the blocking webhook, not the first warning.
	if !strings.Contains(f.Do, "kubectl patch validatingwebhookconfiguration single") {
		t.Errorf("do: %s", f.Do)
	}
}

// End to end through failClosedOf: a webhook with failurePolicy unset on a
// single control-plane node blocks.
func TestFailClosedUnsetPolicyBlocks(t *testing.T) {
	hooks := failClosedOf([]admissionregistrationv1.ValidatingWebhookConfiguration{{
		ObjectMeta: metav1.ObjectMeta{Name: "policy"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "v.policy.io", ClientConfig: whService("pol", "svc")}},
	}}, nil)
	f := judgeWebhooks(hooks, map[types.NamespacedName]webhookBackend{
		{Namespace: "pol", Name: "svc"}: {Slices: []discoveryv1.EndpointSlice{whSlice([2]string{"cp1", "true"})}},
	}, map[string]bool{"cp1": true})
	if f.Result != Block {
		t.Fatalf("result %s: %s", f.Result, f.Found)
	}
}
