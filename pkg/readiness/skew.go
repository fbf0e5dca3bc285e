package readiness

import "context"

func versionSkew(ctx context.Context, c *Cluster) Finding { return Finding{Result: Warn, Found: "not built"} }
