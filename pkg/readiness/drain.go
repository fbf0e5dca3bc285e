package readiness

import "context"

func drainBlockers(ctx context.Context, c *Cluster) Finding { return Finding{Result: Warn, Found: "not built"} }
