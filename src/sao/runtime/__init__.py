"""The run: assembly from per-section factories (`build`), the run loop (`runner`), staleness control,
the producer, evaluation during training, progress display and plots."""
