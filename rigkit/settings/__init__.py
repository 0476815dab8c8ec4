"""Settings: the knob registry, every role variable and its default, host data to validated settings, profiles,
sizing, and the settings reference generated from them."""
