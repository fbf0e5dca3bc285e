package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kjson "sigs.k8s.io/json"
)

// listPage bounds each list request, so that the API server's answers stay
// small and a page that fails costs little to repeat.
var listPage int64 = 500

// Lister reads whole collections of the management cluster, decoding each
// item from the response as it arrives and handing it on before the next is
// read.
//
// A typed client (controller-runtime's, client-go's) reads a page's whole
// body and decodes all of it before the caller sees an item: at fleet scale
// that is megabytes of JSON and of objects held at once (a Cluster API object
// as the API server sends it carries its managed fields, conditions and
// references), of which a fleet view keeps a few fields. Decoding one item at
// a time keeps the memory of a list to one object, whatever the fleet.
// Kubernetes' own item-by-item list, a watch that sends the initial state,
// would need the watch permission besides list, and an API server with the
// WatchList feature: these are plain paged lists, which every API server
// serves to whoever may list.
type Lister struct {
	rest rest.Interface
}

// NewLister is a Lister of the API server cfg names.
func NewLister(cfg *rest.Config) (*Lister, error) {
	cfg = rest.CopyConfig(cfg)
	// Only list responses are decoded here, and by decodeList; the REST
	// client's serializer decodes the API server's error Statuses.
	cfg.NegotiatedSerializer = serializer.WithoutConversionCodecFactory{CodecFactory: clientgoscheme.Codecs}
	cfg.AcceptContentTypes, cfg.ContentType = "application/json", "application/json"
	rc, err := rest.UnversionedRESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &Lister{rest: rc}, nil
}

// collection is one resource, where to list it and how to select in it.
type collection struct {
	gv        schema.GroupVersion
	resource  string
	namespace string // every namespace when empty
	labels    string // a label selector, as the API takes it
}

// listEach calls each for every item of what, in the API server's order (by
// namespace and name), a page of listPage at a time. Each item is a new T:
// each may keep it.
func listEach[T any](ctx context.Context, l *Lister, what collection, each func(*T)) error {
	path := "/apis/" + what.gv.Group + "/" + what.gv.Version
	if what.gv.Group == "" {
		path = "/api/" + what.gv.Version
	}
	cont := ""
	for {
		req := l.rest.Get().AbsPath(path).Resource(what.resource).
			Param("limit", strconv.FormatInt(listPage, 10))
		if what.namespace != "" {
			req = req.Namespace(what.namespace)
		}
		if what.labels != "" {
			req = req.Param("labelSelector", what.labels)
		}
		if cont != "" {
			req = req.Param("continue", cont)
		}
		body, err := req.Stream(ctx)
		if err != nil {
			return err
		}
		cont, err = decodeList(body, each)
		if closeErr := body.Close(); err == nil {
			err = closeErr
		}
		if err != nil {
			return err
		}
		if cont == "" {
			return nil
		}
	}
}

// decodeList reads one list response, {"kind":…, "metadata":{…},
// "items":[…]} with its keys in any order, handing each item to each as it
// is decoded, and returns the list's continue token.
func decodeList[T any](body io.Reader, each func(*T)) (cont string, err error) {
	// The API machinery's own decoding: keys match case-sensitively, as
	// they do in every typed client.
	dec := kjson.NewDecoderCaseSensitivePreserveInts(body)
	if err := expectDelim(dec, '{'); err != nil {
		return "", err
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		switch key {
		case "items":
			switch tok, err := dec.Token(); {
			case err != nil:
				return "", err
			case tok == nil: // "items": null, a list of none
				continue
			case tok != json.Delim('['):
				return "", fmt.Errorf("decoding a list: found %v where its items belong", tok)
			}
			for dec.More() {
				item := new(T)
				if err := dec.Decode(item); err != nil {
					return "", fmt.Errorf("decoding a list item: %w", err)
				}
				each(item)
			}
			if err := expectDelim(dec, ']'); err != nil {
				return "", err
			}
		case "metadata":
			var meta metav1.ListMeta
			if err := dec.Decode(&meta); err != nil {
				return "", fmt.Errorf("decoding a list's metadata: %w", err)
			}
			cont = meta.Continue
		default: // apiVersion, kind
			var skip any
			if err := dec.Decode(&skip); err != nil {
				return "", err
			}
		}
	}
	return cont, expectDelim(dec, '}')
}

func expectDelim(dec kjson.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("decoding a list: %w", err)
	}
	if tok != want {
		return fmt.Errorf("decoding a list: found %v where %q belongs", tok, want)
	}
	return nil
}
