package readiness

import "context"

func failClosedWebhooks(ctx context.Context, c *Cluster) Finding { return Finding{Result: Warn, Found: "not built"} }
