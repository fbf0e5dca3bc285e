package etcd

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func reported(id, term, leader uint64) *clientv3.StatusResponse {
	return &clientv3.StatusResponse{Header: &etcdserverpb.ResponseHeader{MemberId: id}, RaftTerm: term, Leader: leader}
}

// The leader is what the members in the highest term agree on, and a known
// voter; anything else is unknown, never "no leader".
func TestLeaderOf(t *testing.T) {
	three := []Member{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3, Name: "c"}}
	withLearner := []Member{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3, Name: "c", Learner: true}}
	cases := []struct {
		name     string
		members  []Member
		statuses []*clientv3.StatusResponse
		leader   uint64
		unknown  string
	}{
		{"all agree", three, []*clientv3.StatusResponse{reported(1, 5, 2), reported(2, 5, 2), reported(3, 5, 2)}, 2, ""},
		{"a member in an older term is ignored", three, []*clientv3.StatusResponse{reported(1, 4, 1), reported(2, 5, 2), reported(3, 5, 2)}, 2, ""},
		{"an unreachable member is ignored", three, []*clientv3.StatusResponse{nil, reported(2, 5, 3), reported(3, 5, 3)}, 3, ""},
		{"nobody names a leader", three, []*clientv3.StatusResponse{reported(1, 5, 0), reported(2, 5, 0), nil}, 0, "no member names a leader"},
		{"members of one term disagree", three, []*clientv3.StatusResponse{reported(1, 5, 1), reported(2, 5, 2), reported(3, 5, 2)}, 0, "different leaders"},
		{"an unknown member is named", three, []*clientv3.StatusResponse{reported(1, 5, 9), reported(2, 5, 9), reported(3, 5, 9)}, 0, "not a voting member"},
		{"a learner is named", withLearner, []*clientv3.StatusResponse{reported(1, 5, 3), reported(2, 5, 3), nil}, 0, "not a voting member"},
		{"a status answered by another member is ignored", three, []*clientv3.StatusResponse{reported(7, 9, 7), reported(2, 5, 1), reported(3, 5, 1)}, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leader, err := leaderOf(tc.members, tc.statuses)
			if tc.unknown == "" {
				if err != nil || leader != tc.leader {
					t.Fatalf("leader %x, %v; want %x", leader, err, tc.leader)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.unknown) {
				t.Fatalf("leader %x, %v; want unknown: %s", leader, err, tc.unknown)
			}
		})
	}
}
