"""Callbacks for trainers: Composer (composer.OomflightCallback) and Lightning (lightning.OomflightCallback).
Neither framework is imported until its module is: the package imports without them."""
