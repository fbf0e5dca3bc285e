package readiness

import "context"

func removedAPIs(ctx context.Context, c *Cluster) Finding { return Finding{Result: Warn, Found: "not built"} }
