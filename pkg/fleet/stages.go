package fleet

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Member is a selected cluster as a staged run places it.
type Member struct {
	Cluster
	Stage int `json:"stage"` // 1-based
	// Window is its maintenance window; zero when it has none.
	Window Window `json:"-"`
	// Replicas is its control plane's desired size, as its Cluster's status
	// reports it (0 when not yet reported): what a window must hold.
	Replicas int32 `json:"-"`
}

// ParseStages parses --stages: label selectors separated by ";", the rings
// in the order they go. Each must select something on its own.
func ParseStages(s string) ([]labels.Selector, error) {
	var stages []labels.Selector
	for i, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		sel, err := labels.Parse(part)
		switch {
		case err != nil:
			return nil, fmt.Errorf("stage %d %q: %w", i+1, part, err)
		case sel.Empty():
			return nil, fmt.Errorf("stage %d is empty: each stage is a label selector such as ring=canary", i+1)
		}
		stages = append(stages, sel)
	}
	return stages, nil
}

// Place selects the clusters in scope and places each in the first stage
// whose selector it matches; with no stages, all are in one. A cluster in
// no stage, or whose window annotation does not parse, is skipped, with the
// reason: a run does not guess a ring or a window.
func Place(ctx context.Context, l *Lister, scope Scope, stages []labels.Selector) (members []Member, skipped []Skipped, err error) {
	all, err := listClusters(ctx, l, scope)
	if err != nil {
		return nil, nil, err
	}
	if len(stages) == 0 {
		stages = []labels.Selector{labels.Everything()}
	}
	for _, s := range all {
		if s.problem != "" {
			skipped = append(skipped, Skipped{Cluster: s.Cluster, Reason: s.problem})
			continue
		}
		stage := 0
		for i, sel := range stages {
			if sel.Matches(s.labels) {
				stage = i + 1
				break
			}
		}
		if stage == 0 {
			skipped = append(skipped, Skipped{Cluster: s.Cluster, Reason: "in no stage of --stages"})
			continue
		}
		w, err := ParseWindow(s.window)
		if err != nil {
			skipped = append(skipped, Skipped{Cluster: s.Cluster, Reason: err.Error()})
			continue
		}
		members = append(members, Member{Cluster: s.Cluster, Stage: stage, Window: w, Replicas: s.replicas})
	}
	return members, skipped, nil
}
