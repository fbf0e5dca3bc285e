package initgc

import (
	"os"
	"runtime/debug"
	"testing"
)

func TestCollectorOffUntilRestored(t *testing.T) {
	if got := debug.SetGCPercent(-1); got != -1 {
		t.Fatalf("before Restore the collector's setting is %d, want -1 (off)", got)
	}
	if percent == -1 && os.Getenv("GOGC") != "off" {
		t.Fatalf("the setting kept for Restore is -1 (off), but GOGC is %q", os.Getenv("GOGC"))
	}
	Restore()
	if got := debug.SetGCPercent(percent); got != percent {
		t.Fatalf("after Restore the collector's setting is %d, want %d", got, percent)
	}
}
