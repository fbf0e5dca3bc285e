package readiness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	admissionregistrationv1client "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"

	"golang.org/x/sync/errgroup"
)

// failClosedWebhooks looks for admission webhooks that a control-plane
// drain can take down while they fail closed: the validating and mutating
// webhook configurations of the workload cluster, and for each webhook with
// failurePolicy Fail that calls a Service, that Service and its
// EndpointSlices. The API server calls such a webhook on every write it
// matches and refuses the write when the call fails; so a webhook whose
// ready endpoints all sit on one control-plane node fails every such write
// from the moment that node drains until its pods run elsewhere — writes
// the rollout itself makes, or a controller it waits on. Spread over
// several control-plane nodes, only one goes at a time: a warning. With no
// ready endpoint at all, the writes fail now. A webhook that calls a url
// runs somewhere this cannot see: noted, not judged.
func failClosedWebhooks(ctx context.Context, c *Cluster) Finding {
	if c.Snapshot == nil || c.Snapshot.CP == nil {
		return notChecked("the control plane", errors.New("not read"))
	}
	if c.Workload == nil {
		return notChecked("the workload cluster", errors.New("not reached"))
	}
	admission, err := admissionregistrationv1client.NewForConfig(c.Workload.Config)
	if err != nil {
		return notChecked("an admissionregistration/v1 client for the workload cluster", err)
	}
	disc, err := discoveryv1client.NewForConfig(c.Workload.Config)
	if err != nil {
		return notChecked("a discovery/v1 client for the workload cluster", err)
	}
	validating, err := admission.ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return notChecked("ValidatingWebhookConfigurations", err)
	}
	mutating, err := admission.MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return notChecked("MutatingWebhookConfigurations", err)
	}
	hooks := failClosedOf(validating.Items, mutating.Items)

	// Each Service once, however many webhooks call it.
	backends := map[types.NamespacedName]webhookBackend{}
	for _, h := range hooks {
		if !h.URL {
			backends[h.Service] = webhookBackend{}
		}
	}
	var (
		mu sync.Mutex
		g  errgroup.Group
	)
	g.SetLimit(4)
	for svc := range backends {
		g.Go(func() error {
			var b webhookBackend
			s, err := c.Workload.Kube.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				b.Missing = true
			case err != nil:
				return fmt.Errorf("reading service %s: %w", svc, err)
			case s.Spec.Type == corev1.ServiceTypeExternalName:
				b.ExternalName = s.Spec.ExternalName
			default:
				list, err := disc.EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{
					LabelSelector: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}).String()})
				if err != nil {
					return fmt.Errorf("listing the EndpointSlices of service %s: %w", svc, err)
				}
				b.Slices = list.Items
			}
			mu.Lock()
			backends[svc] = b
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return notChecked("the services of fail-closed webhooks", err)
	}
	cp := map[string]bool{}
	for _, m := range drainedMachines(c.Snapshot.CP.Machines.UnsortedList()) {
		cp[m.Status.NodeRef.Name] = true
	}
	return judgeWebhooks(hooks, backends, cp)
}

// admissionWebhook is one webhook of a configuration that fails closed.
type admissionWebhook struct {
	// Kind is ValidatingWebhookConfiguration or MutatingWebhookConfiguration;
	// Config its name.
	Kind, Config string
	// Index is the webhook's place in the configuration's webhooks, for a
	// patch of its failurePolicy.
	Index int
	Name  string
	// URL is set when the webhook calls a url, not a Service.
	URL     bool
	Service types.NamespacedName
}

// failClosedOf are the webhooks whose failurePolicy is Fail — unset counts
// as Fail, admissionregistration/v1's default — in configuration order. A
// webhook with neither a url nor a service is left out: the API server
// refuses such a configuration.
func failClosedOf(validating []admissionregistrationv1.ValidatingWebhookConfiguration, mutating []admissionregistrationv1.MutatingWebhookConfiguration) []admissionWebhook {
	var out []admissionWebhook
	add := func(kind, config string, i int, name string, policy *admissionregistrationv1.FailurePolicyType, cc admissionregistrationv1.WebhookClientConfig) {
		if policy != nil && *policy != admissionregistrationv1.Fail {
			return
		}
		h := admissionWebhook{Kind: kind, Config: config, Index: i, Name: name}
		switch {
		case cc.URL != nil:
			h.URL = true
		case cc.Service != nil:
			h.Service = types.NamespacedName{Namespace: cc.Service.Namespace, Name: cc.Service.Name}
		default:
			return
		}
		out = append(out, h)
	}
	for _, v := range validating {
		for i, w := range v.Webhooks {
			add("ValidatingWebhookConfiguration", v.Name, i, w.Name, w.FailurePolicy, w.ClientConfig)
		}
	}
	for _, m := range mutating {
		for i, w := range m.Webhooks {
			add("MutatingWebhookConfiguration", m.Name, i, w.Name, w.FailurePolicy, w.ClientConfig)
		}
	}
	return out
}

// webhookBackend is what was read of a webhook's Service.
type webhookBackend struct {
	// Missing: no Service of that name.
	Missing bool
	// ExternalName is set for a Service of type ExternalName: it has no
	// endpoints here, and where its name leads is not seen.
	ExternalName string
	Slices       []discoveryv1.EndpointSlice
}

// readyNodes are the nodes of b's ready endpoints, and whether any ready
// endpoint has no node. Ready unset counts as ready, as the EndpointSlice
// API says consumers should take it; a terminating or unready endpoint
// gets no traffic and is left out. An endpoint without a node is not a pod
// of this cluster's nodes (an address set by hand): no drain here takes it
// down.
func (b webhookBackend) readyNodes() (nodes []string, nodeless bool) {
	seen := map[string]bool{}
	for _, s := range b.Slices {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if ep.NodeName == nil || *ep.NodeName == "" {
				nodeless = true
				continue
			}
			seen[*ep.NodeName] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nodeless
}

// judgeWebhooks judges each fail-closed webhook by where its Service's
// ready endpoints run, against cp, the control-plane nodes. Webhooks of
// one configuration that call one Service are judged and named together.
func judgeWebhooks(hooks []admissionWebhook, backends map[types.NamespacedName]webhookBackend, cp map[string]bool) Finding {
	type group struct {
		first admissionWebhook
		names []string
	}
	var (
		order []string
		byKey = map[string]*group{}
		urls  []string
	)
	for _, h := range hooks {
		if h.URL {
			urls = append(urls, fmt.Sprintf("%s %s webhook %s", h.Kind, h.Config, h.Name))
			continue
		}
		key := h.Kind + "/" + h.Config + "/" + h.Service.String()
		if byKey[key] == nil {
			byKey[key] = &group{first: h}
			order = append(order, key)
		}
		byKey[key].names = append(byKey[key].names, h.Name)
	}

	var (
		blocks, warns, notes []string
		judged, held         int
		down                 []string
		// firstBlock and firstWarn are the webhooks the Do's patch names.
		firstBlock, firstWarn *admissionWebhook
	)
	for _, key := range order {
		g := byKey[key]
		h := g.first
		webhook := "webhook"
		if len(g.names) > 1 {
			webhook = "webhooks"
		}
		what := fmt.Sprintf("%s %s (%s %s) calls service %s", h.Kind, h.Config, webhook, strings.Join(g.names, ", "), h.Service)
		b := backends[h.Service]
		if b.ExternalName != "" {
			notes = append(notes, fmt.Sprintf("not judged: %s, an ExternalName to %s", what, b.ExternalName))
			continue
		}
		judged += len(g.names)
		nodes, nodeless := b.readyNodes()
		offCP := nodeless
		for _, n := range nodes {
			if !cp[n] {
				offCP = true
			}
		}
		switch {
		case b.Missing:
			blocks = append(blocks, what+", which does not exist: every write it matches fails now")
			down = append(down, h.Service.String())
		case len(nodes) == 0 && !nodeless:
			blocks = append(blocks, what+", which has no ready endpoint: every write it matches fails now")
			down = append(down, h.Service.String())
		case offCP:
			// A ready endpoint no control-plane drain touches: the webhook
			// answers throughout.
			continue
		case len(nodes) == 1:
			blocks = append(blocks, fmt.Sprintf("%s, ready only on control-plane node %s: its drain takes the webhook down, and every write it matches fails until the pods run elsewhere", what, nodes[0]))
			held++
		default:
			warns = append(warns, fmt.Sprintf("%s, ready only on control-plane nodes %s: each drain takes one of them away", what, strings.Join(nodes, ", ")))
			held++
			if firstWarn == nil {
				firstWarn = &h
			}
			continue
		}
		if firstBlock == nil {
			firstBlock = &h
		}
	}
	if len(urls) > 0 {
		notes = append(notes, "not judged (it calls a url, where it runs is not known): "+namedUpTo(urls, 5))
	}

	f := Finding{Result: Pass}
	switch {
	case len(blocks) > 0:
		f.Result = Block
		f.Found = strings.Join(append(blocks, warns...), "; ")
	case len(warns) > 0:
		f.Result = Warn
		f.Found = strings.Join(warns, "; ")
	case judged == 0:
		f.Found = "no webhook with failurePolicy Fail calls a Service with endpoints in the cluster"
	default:
		f.Found = fmt.Sprintf("%d webhooks with failurePolicy Fail: each service has a ready endpoint off the control-plane nodes", judged)
	}
	if len(notes) > 0 {
		f.Found += "; " + strings.Join(notes, "; ")
	}
	if f.Result == Pass {
		return f
	}
	var do []string
	if len(down) > 0 {
		down = slices.Compact(slices.Sorted(slices.Values(down)))
		ns, _, _ := strings.Cut(down[0], "/")
		do = append(do, fmt.Sprintf("bring back the pods of %s (`kubectl -n %s get pods,endpointslices`)", strings.Join(down, ", "), ns))
	}
	patch := firstBlock
	if patch == nil {
		patch = firstWarn
	}
	if held > 0 {
		do = append(do, "run the webhook's pods off the control-plane nodes, or with more replicas spread over nodes and a PodDisruptionBudget")
	}
	do = append(do, fmt.Sprintf("or set failurePolicy Ignore for the upgrade and back to Fail after (`kubectl patch %s %s --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/%d/failurePolicy\",\"value\":\"Ignore\"}]'`)",
		strings.ToLower(patch.Kind), patch.Config, patch.Index))
	f.Do = strings.Join(do, "; ")
	return f
}
