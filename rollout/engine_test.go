package rollout

import (
	"reflect"
	"testing"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
)

// TestPlaysSetsEveryRole: an engine given its control plane by Plays, as
// connect gives it *controlplane.Client, has every management-cluster role
// set. Every field of the Engine that the control plane could play counts,
// so a role added to the Engine and forgotten in Plays fails here.
func TestPlaysSetsEveryRole(t *testing.T) {
	e := (&Engine{}).Plays(&controlplane.Client{})
	plays := reflect.TypeFor[ControlPlane]()
	v, roles := reflect.ValueOf(e).Elem(), 0
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() != reflect.Interface || f.Type.NumMethod() == 0 || !plays.Implements(f.Type) {
			continue
		}
		roles++
		if v.Field(i).IsNil() {
			t.Errorf("Plays leaves the Engine's %s (%s) nil", f.Name, f.Type.Name())
		}
	}
	if roles != 5 {
		t.Errorf("%d role fields on the Engine, want 5 (Reader, Machines, Lease, HandOver, Topology)", roles)
	}
}
