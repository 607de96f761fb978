"""The config tree's Python side: Hydra setup (resolvers, schemas) and the cross-field checks of a composed config."""
