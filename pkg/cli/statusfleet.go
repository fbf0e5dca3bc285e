package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// etcdReadsAtOnce bounds status --etcd: each cluster's read opens a
// port-forward per member through its workload API server.
const etcdReadsAtOnce = 8

// fleetReader returns what reads one row per selected cluster, afresh at
// each call: -w calls it every interval. The selection and the management
// cluster's client are set up once; every list through them is live.
func (o *StatusOptions) fleetReader() (read func(context.Context) (*statusView, error), err error) {
	scope, err := o.conn.scope(o.sel)
	if err != nil {
		return nil, err
	}
	mgmt, err := o.conn.managementReader()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (*statusView, error) {
		rows, err := fleet.Overview(ctx, mgmt, scope)
		if err != nil {
			return nil, o.conn.firstContact(ctx, err)
		}
		if len(rows) == 0 {
			return nil, exitcode.Usagef("no Cluster %s", scope)
		}
		if o.Etcd {
			o.readEtcd(ctx, rows)
		}
		return &statusView{rows: rows}, nil
	}, nil
}

// readEtcd fills each row's etcd health, etcdReadsAtOnce clusters at a time.
// A cluster that cannot be read says why in its row; it fails nothing.
func (o *StatusOptions) readEtcd(ctx context.Context, rows []fleet.Row) {
	var g errgroup.Group
	g.SetLimit(etcdReadsAtOnce)
	for i := range rows {
		if rows[i].Problem != "" {
			continue
		}
		g.Go(func() error {
			rows[i].Etcd = o.etcdHealth(ctx, rows[i].Cluster)
			return nil
		})
	}
	_ = g.Wait()
}

// etcdHealth reads one cluster's etcd members as a single cluster's status
// does, without its permission check (the fleet's reads already passed).
func (o *StatusOptions) etcdHealth(ctx context.Context, c fleet.Cluster) *fleet.EtcdHealth {
	one := o.conn.forCluster(c)
	conn, err := one.connect(ctx, noLoop)
	if err != nil {
		return &fleet.EtcdHealth{Error: err.Error()}
	}
	defer conn.close()
	s, err := conn.engine.SnapshotOf(ctx, conn.first)
	if err != nil {
		return &fleet.EtcdHealth{Error: err.Error()}
	}
	if !s.EtcdManaged {
		return &fleet.EtcdHealth{Error: "external etcd"}
	}
	h := &fleet.EtcdHealth{Members: len(s.Members)}
	for _, m := range s.Members {
		if m.Healthy {
			h.Healthy++
		}
		if m.Leader {
			h.Leader = m.Name
		}
	}
	return h
}

// printFleetStatus prints a row per cluster, then, without -o wide's
// PROBLEM column, each problem on a line of its own.
func printFleetStatus(out io.Writer, rows []fleet.Row, opts tableOptions, etcd bool) error {
	names := []string{"CLUSTER", "VERSION", "REPLICAS", "UP-TO-DATE", "ACTING", "PAUSED", "LOCK", "OPERATION", "LAST OPERATION"}
	if etcd {
		names = append(names, "ETCD")
	}
	var cells [][]any
	var problems []string
	for _, r := range rows {
		if r.Problem != "" {
			problems = append(problems, fmt.Sprintf("%s: %s", r.Cluster, r.Problem))
		}
		line := []any{r.Cluster.String(), dash(r.Version), r.Replicas, fmt.Sprintf("%d/%d", r.UpToDate, r.Machines),
			actingOf(r), pausedBy(r), lockOf(r), dash(operation(r.Operation)), dash(lastOperation(r.LastOperation))}
		if etcd {
			line = append(line, etcdOf(r.Etcd))
		}
		by := ""
		if r.Operation != nil {
			by = r.Operation.Who
		}
		cells = append(cells, append(line, dash(by), dash(r.Problem)))
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns(names, "STARTED BY", "PROBLEM"), cells, opts); err != nil {
		return err
	}
	if !opts.Wide {
		for _, p := range problems {
			fmt.Fprintf(w, "\nWARNING\t%s\n", p)
		}
	}
	return w.Flush()
}

// actingOf is the ACTING column: who changes the machines, and for KCP or
// nobody why; a run of this tool is named by the LOCK and OPERATION columns.
func actingOf(r fleet.Row) string {
	switch {
	case r.Acting == nil:
		return "-"
	case r.Acting.Who == "cp-rollout":
		return r.Acting.Who
	}
	return r.Acting.String()
}

func pausedBy(r fleet.Row) string {
	switch {
	case r.PausedByUs:
		return "cp-rollout"
	case r.Paused:
		return "someone else"
	}
	return "no"
}

func lockOf(r fleet.Row) string {
	if r.Lock == nil || r.Lock.Holder == "" {
		return "free"
	}
	if !r.Lock.Live {
		return r.Lock.Holder + " (expired)"
	}
	return r.Lock.Holder
}

func operation(rec *record.Record) string {
	if rec == nil {
		return ""
	}
	if rec.Operation == record.PauseOperation {
		return rec.String()
	}
	line := rec.Operation + " to " + rec.Target
	if f := rec.LastFailure; f != nil {
		// The reason is status CLUSTER's to show: a fleet's row stays short.
		line += fmt.Sprintf(", last run failed (exit %d)", f.ExitCode)
	}
	return line
}

func lastOperation(rec *record.Record) string {
	if rec == nil {
		return ""
	}
	line := operation(rec)
	if rec.Finished != nil {
		line += ", finished " + rec.Finished.UTC().Format(time.RFC3339)
	}
	return line
}

// etcdOf is the ETCD column: healthy members of all and the leader, or why
// etcd could not be read.
func etcdOf(h *fleet.EtcdHealth) string {
	switch {
	case h == nil:
		return "-"
	case h.Error != "":
		return "unreadable: " + firstLine(h.Error)
	}
	return fmt.Sprintf("%d/%d healthy, leader %s", h.Healthy, h.Members, dash(h.Leader))
}
