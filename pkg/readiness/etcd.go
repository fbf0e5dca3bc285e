package readiness

import "context"

func etcdHealth(ctx context.Context, c *Cluster) Finding { return Finding{Result: Warn, Found: "not built"} }
