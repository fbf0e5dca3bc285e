package exitcode

import "testing"

func TestWorstFollowsTheDocumentedOrder(t *testing.T) {
	for _, tc := range []struct {
		codes []int
		want  int
	}{
		{nil, OK},
		{[]int{OK, OK}, OK},
		{[]int{OK, Usage}, Usage},
		{[]int{Locked, Forbidden}, Locked},
		{[]int{Unsafe, Locked}, Unsafe},
		{[]int{Unsafe, Timeout}, Timeout},
		{[]int{Timeout, Failure, Unsafe}, Failure},
		{[]int{Failure, Interrupted, OK}, Interrupted},
		{[]int{Unsafe, 42}, 42}, // unknown: ranks as a failure
		{[]int{42, Failure}, 42},
	} {
		if got := Worst(tc.codes...); got != tc.want {
			t.Errorf("Worst(%v) = %d, want %d", tc.codes, got, tc.want)
		}
	}
}
