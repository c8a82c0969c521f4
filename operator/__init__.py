"""metainfer.operator: kopf handlers, thin shells around metainfer.core."""
