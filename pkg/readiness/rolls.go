package readiness

import "context"

func alsoRolls(ctx context.Context, c *Cluster) Finding { return Finding{Result: Warn, Found: "not built"} }
