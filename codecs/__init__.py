"""fulmar.codecs: SBE schemas, the generator, and the generated codecs."""
