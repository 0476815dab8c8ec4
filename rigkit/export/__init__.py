"""rigkit export: one inventory group's serving stack as Kubernetes objects or production-stack Helm values,
derived from the same rendering an SSH rig gets (rigkit.settings.hostdata, rigkit.serving.render)."""
