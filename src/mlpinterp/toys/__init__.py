"""toys"""
